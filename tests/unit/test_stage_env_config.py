"""`python:` / `env:` in a pipeline file (omni/config/environments.py), the spec that reaches
an engine in its own environment, and the version check at its handshake."""

from __future__ import annotations

import os
import sys

import msgpack
import pytest

from omni.config.pipeline import ConfigError, parse_pipeline
from omni.engines.proc.spec import EngineSpec, spec_bytes, spec_from_bytes, stage_spec
from omni.runtime.versions import wire_refusal
from omni.wire.protocol import WIRE_VERSION, Heartbeat, Ready, encode, ready_version


def one(base_dir=None, **stage):
    return parse_pipeline({"name": "p", "stages": [
        {"name": "s", "engine": "echo", "final_output": "text", **stage}]}, "p.yaml",
        base_dir=base_dir)


def fake_env(root, name):
    python = root / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


def test_python_is_kept_as_written_not_resolved(tmp_path):
    assert one().stage("s").python is None
    link = tmp_path / "venv-python"
    link.symlink_to(sys.executable)  # a venv's bin/python is such a link
    assert one(python=str(link)).stage("s").python == str(link)
    assert one(str(tmp_path), python="venv-python").stage("s").python == str(link)


def test_env_names_one_in_the_envs_dir(tmp_path, monkeypatch):
    python = fake_env(tmp_path, "qwen-tts")
    monkeypatch.setenv("OMNI_ENVS_DIR", str(tmp_path))
    assert one(env="qwen-tts").stage("s").python == str(python)


def test_the_envs_dir_defaults_to_the_cache(monkeypatch):
    monkeypatch.delenv("OMNI_ENVS_DIR", raising=False)
    with pytest.raises(ConfigError) as error:
        one(env="surely-not-made-here")
    assert error.value.path == "stages[0].env"
    assert os.path.expanduser("~/.cache/omni/envs/surely-not-made-here") in str(error.value)


@pytest.mark.parametrize(("stage", "field", "words"), [
    ({"env": "missing"}, "env", ["no environment 'missing'",
                                 "scripts/make_stage_env.sh missing REQUIREMENTS_FILE"]),
    ({"env": "../up"}, "env", ["bad environment name"]),
    ({"env": 3}, "env", ["expected a non-empty string"]),
    ({"python": "/nowhere/bin/python"}, "python", ["is not an executable file",
                                                   "scripts/make_stage_env.sh"]),
    ({"python": "PY", "env": "x"}, "python", ["names its environment once"]),
    ({"python": "PY", "launch": "external"}, "python", ["only replicas this server starts"]),
    ({"python": "PY", "placement": {"kind": "ray"}}, "python", ["Ray-placed"]),
])
def test_errors_name_the_field_and_how_to_make_the_env(tmp_path, monkeypatch, stage, field,
                                                       words):
    monkeypatch.setenv("OMNI_ENVS_DIR", str(tmp_path))
    stage = {k: sys.executable if v == "PY" else v for k, v in stage.items()}
    with pytest.raises(ConfigError) as error:
        one(**stage)
    assert error.value.path == f"stages[0].{field}"
    for word in words:
        assert word in str(error.value)


def test_the_spec_travels_as_msgpack_and_tolerates_another_omni():
    pipeline = one(python=sys.executable, options={"chunks": 2, "delay_ms": 5})
    spec = stage_spec(pipeline, "s", 0, control_address="ipc:///tmp/x.sock", arena_name="a")
    assert spec_from_bytes(spec_bytes(spec)) == spec
    fields = msgpack.unpackb(spec_bytes(spec))
    # a newer server's field is dropped; one an older server did not send takes its default
    fields["from_the_future"] = 1
    del fields["memory_share"]
    assert spec_from_bytes(msgpack.packb(fields)) == spec
    assert isinstance(spec_from_bytes(msgpack.packb(fields)), EngineSpec)


def test_ready_says_its_version_and_another_is_refused_with_the_fix():
    assert ready_version(encode(Ready("s/0", {}, WIRE_VERSION))) == WIRE_VERSION
    assert ready_version(encode(Ready("s/0", {}))) == 0  # an engine from before versions
    assert ready_version(encode(Heartbeat("s/0"))) is None
    # a newer engine's Ready, with a field this version does not know, still says its version
    newer = msgpack.packb([10, "s/0", {}, WIRE_VERSION + 1, "a later field"])
    assert ready_version(newer) == WIRE_VERSION + 1
    assert wire_refusal(encode(Ready("s/0", {}, WIRE_VERSION)), "s/0", None) is None
    refusal = wire_refusal(newer, "s/0", "/envs/x/bin/python")
    assert f"version {WIRE_VERSION + 1}, this server speaks {WIRE_VERSION}" in refusal
    assert "Reinstall omni in the environment of /envs/x/bin/python" in refusal
    assert "(an omni from before" in wire_refusal(encode(Ready("s/0", {})), "s/0", None)
