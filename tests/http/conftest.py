"""Fixtures for the HTTP tests (servers on loopback); helpers live in httputil.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
from httputil import (  # noqa: E402
    MAIN_MAX_REQUEST_BYTES,
    MAIN_PIPELINES,
    START_TIMEOUT_S,
    Server,
    ServerSettings,
    write_pipeline,
)

from omni.fixtures.tiny_models import ensure_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def start_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Factory: start_server({served_name: preset name or yaml text}, settings) -> Server.

    Values that contain a newline are YAML text written to a temp file; others are
    preset names or paths. Every server started here stops at the end of the module.
    """
    servers: list[Server] = []
    directory = tmp_path_factory.mktemp("pipelines")

    def start(pipelines: dict[str, str], settings: ServerSettings | None = None,
              start_timeout_s: float = START_TIMEOUT_S) -> Server:
        targets: dict[str, str | Path] = {}
        for name, value in pipelines.items():
            targets[name] = write_pipeline(directory, name, value) if "\n" in value else value
        server = Server(targets, settings, start_timeout_s)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def main_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("main-pipelines")
    targets: dict[str, str | Path] = {
        name: write_pipeline(directory, name, value) if "\n" in value else value
        for name, value in MAIN_PIPELINES.items()}
    server = Server(targets, ServerSettings(max_request_bytes=MAIN_MAX_REQUEST_BYTES,
                                            drain_timeout_s=2.0))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def voice_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The small voice pipeline of voiceutil.py (``voice``, its views, ``chat``), shared by
    the realtime / duplex modules that need a model that listens."""
    from voiceutil import voice_pipelines

    directory = tmp_path_factory.mktemp("voice")
    targets: dict[str, str | Path] = {
        name: write_pipeline(directory, name, value)
        for name, value in voice_pipelines(directory).items()}
    server = Server(targets, ServerSettings(drain_timeout_s=2.0))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def speech(voice_server: Server) -> dict[str, bytes]:
    """pcm16 at 24 kHz of voiceutil's sentences, spoken by the voice server's Piper."""
    from voiceutil import QUESTION, STORY, speak

    return speak(voice_server, QUESTION, STORY)


@pytest.fixture(scope="session")
def ar_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real AR engine on the tiny random Qwen3, served as "qwen3": one server for the
    session (four modules only ask it; none kills, restarts or reconfigures it)."""
    model_dir = ensure_tiny_model("qwen3", tmp_path_factory.getbasetemp() / "models")
    server = Server({"qwen3": str(model_dir)})
    server.start()
    yield server
    server.stop()
