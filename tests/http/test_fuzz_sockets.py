"""Generated bad messages on each live WebSocket: /v1/realtime, OpenPI, /v1/world. One
connection gets a bounded stream of them (arbitrary JSON, real events with fields
replaced, binary garbage, media bombs); the server answers each in its own error format
(or with what a valid event gets), never fails the handler, and afterwards that
connection still answers, a second connection works normally and /health is 200.
(/v1/duplex adds binary pcm16 frames to the realtime parser: those are fuzzed in
tests/unit/test_fuzz_ws_parsers.py; its voice pipeline is too heavy for this file.)

The examples differ from run to run: the seed is OMNI_FUZZ_SEED when set, else a random
one; every test prints it (shown with a failure) and its failure messages carry it, so
``OMNI_FUZZ_SEED=<seed> pytest tests/http/test_fuzz_sockets.py`` repeats a failing run.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import textwrap

import aiohttp
import msgpack
import numpy as np
import pytest
from httputil import ServerSettings
from httputil import run as run_unbounded
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from omni.api.openpi import codec
from omni.fixtures import build_tiny_qwen3
from omni.fixtures.media_bombs import png_declaring
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.image import encode_image

FUZZ_SEED = int(os.environ.get("OMNI_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
LIVE_SETTINGS = settings(max_examples=3, deadline=None, database=None,
                         suppress_health_check=[HealthCheck.too_slow,
                                                HealthCheck.function_scoped_fixture])
TIMEOUT_S = 60
# where a handler failure is logged: the app's error middleware and handlers (omni.api,
# omni.api.realtime, ...) and aiohttp's own server loggers ("Error handling request")
HANDLER_LOGGERS = ("omni.api", "aiohttp")


def LIVE(test):  # noqa: N802 - a decorator, named like hypothesis's settings objects
    """Hypothesis settings for the live servers, seeded with FUZZ_SEED."""
    return seed(FUZZ_SEED)(LIVE_SETTINGS(test))


@pytest.fixture(autouse=True)
def fuzz_seed():
    print(f"OMNI_FUZZ_SEED={FUZZ_SEED} (set it to repeat these examples)")
    return FUZZ_SEED


class _ErrorRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        taken, self.records = self.records, []
        return [f"{r.name}: {r.getMessage()}"
                + (f"\n{logging.Formatter().formatException(r.exc_info)}" if r.exc_info
                   else "") for r in taken]


@pytest.fixture(scope="module", autouse=True)
def handler_errors():
    """ERROR records of the server's handlers, for the whole module: a failure logged
    after one example's check (a handler ending after its client left) is still seen by
    the next check or, for the last example, at teardown."""
    handler = _ErrorRecords()
    loggers = [logging.getLogger(name) for name in HANDLER_LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)
    failed = handler.take()
    assert failed == [], f"handler failures (OMNI_FUZZ_SEED={FUZZ_SEED}): {failed}"


def run(coro) -> None:
    """A test body, bounded: a server that stops answering fails the test, not the run."""
    async def bounded():
        return await asyncio.wait_for(coro, 2 * TIMEOUT_S)
    run_unbounded(bounded())

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
           | st.text(max_size=8) | st.sampled_from(["text", "audio", "user", "inf", "auto"]))
json_values = st.recursive(scalars, lambda inner: (
    st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=10)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


@st.composite
def mutated(draw, base: dict) -> dict:
    """``base`` with one field below ``type`` (at any depth) replaced by arbitrary JSON."""
    event = json.loads(json.dumps(base))
    path = draw(st.sampled_from([p for p in _paths(event) if p and p != ("type",)]))
    parent = event
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = draw(json_values)
    return event


def _frames(events) -> st.SearchStrategy:
    """Text frames of events or arbitrary JSON, raw text, or binary frames."""
    return st.lists(events.map(json.dumps) | json_values.map(json.dumps)
                    | st.text(max_size=30) | st.binary(max_size=30)
                    | st.just("[" * 20_000), min_size=3, max_size=12)


def _no_handler_failures(handler_errors: _ErrorRecords) -> None:
    failed = handler_errors.take()
    assert failed == [], f"handler failures (OMNI_FUZZ_SEED={FUZZ_SEED}): {failed}"


async def _send(ws, frame) -> None:
    if isinstance(frame, bytes):
        await ws.send_bytes(frame)
    else:
        await ws.send_str(frame)


async def _health(http) -> None:
    async with http.get("/health") as resp:
        assert resp.status == 200


# -- /v1/realtime ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def realtime_server(start_server, tmp_path_factory):
    model = build_tiny_qwen3(tmp_path_factory.mktemp("fuzz-rt") / "qwen3")
    pipeline = textwrap.dedent(f"""\
        name: chat
        sessions: {{max_sessions: 4}}
        stages:
          - {{name: llm, engine: ar, model_dir: {model}, final_output: text,
              params: {{max_tokens: 4, temperature: 0}}, options: {{block_size: 4}}}}
        """)
    return start_server({"chat": pipeline}, ServerSettings(max_request_bytes=256 * 1024,
                                                           drain_timeout_s=2.0))


ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
REALTIME_EVENTS = [
    {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                           "instructions": "x", "max_output_tokens": 4,
                                           "audio": {"input": {"turn_detection": None}}}},
    {"type": "input_audio_buffer.append", "audio": "AAAA"},
    {"type": "input_audio_buffer.commit", "event_id": "e"},
    {"type": "conversation.item.create", "item": ITEM, "previous_item_id": None},
    {"type": "conversation.item.delete", "item_id": "item_x"},
    {"type": "conversation.item.retrieve", "item_id": "item_x"},
    {"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0},
    {"type": "response.create", "response": {"conversation": "auto", "instructions": "y"}},
    {"type": "response.cancel", "response_id": "resp_x"},
]


async def _realtime_events_until(ws, kind: str) -> list[dict]:
    """Every event up to the first of ``kind``; each is a JSON object with a type, and
    each error carries the OpenAI error fields."""
    seen = []
    while True:
        message = await ws.receive(timeout=TIMEOUT_S)
        assert message.type == aiohttp.WSMsgType.TEXT, (message, seen[-3:])
        event = json.loads(message.data)
        if event["type"] == "error":
            assert {"type", "code", "message", "param", "event_id"} <= set(event["error"])
        seen.append(event)
        if event["type"] == kind:
            return seen


@LIVE
@given(frames=_frames(st.one_of([mutated(e) for e in REALTIME_EVENTS])))
def test_realtime_survives_generated_bad_events(realtime_server, handler_errors, frames):

    async def body():
        async with realtime_server.session() as http:
            async with http.ws_connect("/v1/realtime?model=chat") as ws:
                await _realtime_events_until(ws, "session.created")
                for frame in frames:
                    await _send(ws, frame)
                # the same connection still answers, after everything sent before
                await ws.send_json({"type": "input_audio_buffer.clear"})
                seen = await _realtime_events_until(ws, "input_audio_buffer.cleared")
                assert any(e["type"] == "error" for e in seen)
            async with http.ws_connect("/v1/realtime?model=chat") as ws:
                await _realtime_events_until(ws, "session.created")
                await ws.send_json({"type": "conversation.item.create", "item": ITEM})
                await ws.send_json({"type": "response.create"})
                done = (await _realtime_events_until(ws, "response.done"))[-1]
                assert done["response"]["status"] == "completed", done
            await _health(http)
    run(body())
    _no_handler_failures(handler_errors)


# -- OpenPI ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def openpi_server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("pi0", tmp_path_factory.getbasetemp() / "models")
    pipeline = textwrap.dedent(f"""\
        name: robot
        default_modalities: [actions]
        sessions: {{max_sessions: 3}}
        stages:
          - {{name: policy, engine: policy, model: pi0, model_dir: {model_dir},
              final_output: actions}}
        """)
    return start_server({"robot": pipeline}, ServerSettings(
        policy_seed=7, drain_timeout_s=2.0, max_observation_bytes=1024 * 1024))


def observation(**extra) -> dict:
    rng = np.random.default_rng(0)
    return {"observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/state": rng.standard_normal(8), "prompt": "stack the cups", **extra}


ndarray_maps = st.fixed_dictionaries({
    b"__ndarray__": st.just(True), b"data": st.binary(max_size=16),
    b"dtype": st.sampled_from(["<f4", "|u1", "U0", "O", "<c8", "nope"]),
    b"shape": st.lists(st.integers(0, 2**64 - 1), max_size=3)})


def _pack(value) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except OverflowError:  # an integer past 64 bits: msgpack has no form for it
        return b"\xc1"


openpi_frames = st.lists(
    st.binary(max_size=40) | json_values.map(_pack) | st.text(max_size=20)
    | st.fixed_dictionaries({"observation/state": ndarray_maps, "seed": json_values}
                            ).map(_pack), min_size=3, max_size=10)


async def _openpi_connect(http):
    ws = await http.ws_connect("/", max_msg_size=0)
    metadata = await ws.receive(timeout=TIMEOUT_S)
    assert metadata.type == aiohttp.WSMsgType.BINARY
    return ws


async def _actions(ws) -> dict:
    await ws.send_bytes(codec.packb(observation()))
    reply = await ws.receive(timeout=TIMEOUT_S)
    assert reply.type == aiohttp.WSMsgType.BINARY, reply
    return codec.unpackb(reply.data)


@LIVE
@given(frames=openpi_frames)
def test_openpi_survives_generated_bad_frames(openpi_server, handler_errors, frames):

    async def body():
        async with openpi_server.session() as http:
            ws = await _openpi_connect(http)
            for frame in frames:  # lockstep: one reply each, a text frame for bad input
                await _send(ws, frame)
                reply = await ws.receive(timeout=TIMEOUT_S)
                assert reply.type == aiohttp.WSMsgType.TEXT, reply
                assert reply.data.startswith(("bad observation", "send each observation"))
            assert (await _actions(ws))["actions"].ndim == 2
            await ws.close()
            ws = await _openpi_connect(http)
            assert (await _actions(ws))["actions"].ndim == 2
            await ws.close()
            await _health(http)
    run(body())
    _no_handler_failures(handler_errors)


# -- /v1/world ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world_server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("cosmos3", tmp_path_factory.getbasetemp() / "models")
    pipeline = textwrap.dedent(f"""\
        name: world
        default_modalities: [video]
        sessions: {{max_sessions: 3}}
        stages:
          - {{name: world, engine: diffusion, model: cosmos3_world, model_dir: {model_dir},
              final_output: video, options: {{default_steps: 2}}}}
        """)
    return start_server({"world": pipeline}, ServerSettings(drain_timeout_s=2.0))


FIRST = base64.b64encode(encode_image(np.zeros((64, 64, 3), np.uint8))).decode()
BOMB = base64.b64encode(png_declaring(60000, 60000)).decode()
OPEN = {"type": "session.open", "prompt": "open the drawer", "domain": "droid_lerobot",
        "image": FIRST, "seed": 5}
WORLD_EVENTS = [OPEN, {"type": "step", "actions": [[0.1] * 10] * 4, "seed": 1},
                {**OPEN, "image": BOMB}]


async def _world_until(ws, kind: str | None) -> list[dict]:
    """Every event up to the first of ``kind`` (None: until the server closes); each is
    a JSON object with a type, each error has a code and a message."""
    seen = []
    while True:
        message = await ws.receive(timeout=TIMEOUT_S)
        if message.type == aiohttp.WSMsgType.BINARY:  # a chunk's frames
            continue
        if kind is None and message.type in (aiohttp.WSMsgType.CLOSE,
                                             aiohttp.WSMsgType.CLOSING,
                                             aiohttp.WSMsgType.CLOSED):
            return seen
        assert message.type == aiohttp.WSMsgType.TEXT, (message, seen[-3:])
        event = json.loads(message.data)
        if event["type"] == "error":
            assert {"code", "message"} <= set(event["error"])
        seen.append(event)
        if event["type"] == kind:
            return seen


@LIVE
@given(frames=_frames(st.one_of([mutated(e) for e in WORLD_EVENTS])
                      | st.sampled_from([{**OPEN, "image": BOMB}, {"type": "reset"}])))
def test_world_survives_generated_bad_events(world_server, handler_errors, frames):

    async def body():
        async with world_server.session() as http:
            async with http.ws_connect("/v1/world?model=world") as ws:
                for frame in frames:
                    await _send(ws, frame)
                # answered after all of the above: unknown_event, or no_session if none opened
                await ws.send_json({"type": "sentinel"})
                seen = await _world_until(ws, "error")
                while "sentinel" not in seen[-1]["error"]["message"] and \
                        seen[-1]["error"]["code"] != "no_session":
                    seen = await _world_until(ws, "error")
            async with http.ws_connect("/v1/world?model=world") as ws:
                await ws.send_json({**OPEN, "image": BOMB})
                error = (await _world_until(ws, "error"))[-1]["error"]
                assert "pixels" in error["message"], error
                await ws.send_json(OPEN)
                await _world_until(ws, "session.created")
                await ws.send_json(WORLD_EVENTS[1])
                await _world_until(ws, "chunk")
            await _health(http)
    run(body())
    _no_handler_failures(handler_errors)
