"""What the pipeline YAML tests share (test_config.py, test_config_errors.py,
test_config_outputs.py): a valid base pipeline and loading a patched copy of it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from omni.config.pipeline import ConfigError, PipelineConfig, load_pipeline_file

# A valid two-modality pipeline; tests patch one piece of it at a time.
BASE = """
name: demo
stages:
  - {name: thinker, engine: echo, final_output: text}
  - {name: talker, engine: echo}
  - {name: code2wav, engine: echo, final_output: audio}
edges:
  - {from: thinker, to: talker, payload: hidden_states, delivery: stream}
  - {from: talker, to: code2wav}
"""


def write(tmp_path: Path, text: str, name: str = "pipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, name: str = "pipe.yaml") -> PipelineConfig:
    return load_pipeline_file(write(tmp_path, text, name))


def error(tmp_path: Path, text: str, *fragments: str, name: str = "pipe.yaml") -> str:
    """Load `text`, expect a ConfigError and check the message holds every fragment."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, name)
    message = str(info.value)
    assert message.startswith(str(tmp_path / name) + ": "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def stages_yaml(*lines: str) -> str:
    return "stages:\n" + "".join(f"  - {line}\n" for line in lines)
