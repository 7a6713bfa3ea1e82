"""docs/worlds.md's claims on GET /v1/world the other world tests leave out, on the tiny
Cosmos 3: each kind of bad input gets the error code the docs give it (the socket stays),
every code omni/api/world.py can send is in the docs' table and only those; a session's
``view_point`` reaches the model; a step's actions shorter than ``chunk_size`` repeat their
last row and longer ones are cut."""

from __future__ import annotations

import ast
import base64
import json
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest
from httputil import ServerSettings, run

from omni.api import world
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.image import encode_image

DOC = Path(__file__).resolve().parents[2] / "docs" / "worlds.md"
FIRST = base64.b64encode(encode_image(
    np.random.RandomState(3).randint(0, 255, (64, 64, 3), dtype=np.uint8))).decode()
OPEN = {"type": "session.open", "prompt": "open the drawer", "domain": "droid_lerobot",
        "seed": 5, "image": FIRST}


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    model_dir = ensure_tiny_model("cosmos3", tmp_path_factory.getbasetemp() / "models")
    pipeline = textwrap.dedent(f"""\
        name: world
        default_modalities: [video]
        max_inflight: 1
        stages:
          - {{name: world, engine: diffusion, model: cosmos3_world, model_dir: {model_dir},
              final_output: video, options: {{default_steps: 3}}}}
        """)
    return start_server({"world": pipeline}, ServerSettings(drain_timeout_s=2.0))


def acts(rows: int = 4, width: int = 10, seed: int = 0) -> list:
    return np.random.RandomState(seed).randn(rows, width).round(3).tolist()


async def answer(ws) -> dict:
    """The next JSON event that is not a step's progress (a chunk's frames are read)."""
    while True:
        event = await ws.receive_json(timeout=60)
        if event["type"] == "chunk":
            await ws.receive_bytes(timeout=60)
        if event["type"] != "step.progress":
            return event


async def code_of(ws, frame) -> str:
    if isinstance(frame, bytes):
        await ws.send_bytes(frame)
    else:
        await ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))
    event = await answer(ws)
    assert event["type"] == "error", event
    assert event["error"]["message"], event
    return event["error"]["code"]


def test_each_kind_of_bad_input_gets_its_code(server):
    omni = server.models["world"].omni

    async def body():
        async with server.session() as http:
            ws = await http.ws_connect("/v1/world?model=world")
            before_open = [
                ({"type": "step", "actions": acts()}, "no_session"),
                ({"type": "reset"}, "no_session"),
                ("{not json", "invalid_request"),
                ("[1, 2]", "invalid_request"),  # JSON, not an event
                (b"\x00\x01", "invalid_request"),  # a binary frame
                ({"type": "teleport"}, "unknown_event"),
                ({**OPEN, "image": "###"}, "invalid_request"),
                ({**OPEN, "image": base64.b64encode(b"not an image").decode()},
                 "invalid_request"),
                ({**OPEN, "domain": "mars_rover"}, "invalid_request"),
                ({**OPEN, "prompt": ""}, "invalid_request"),
            ]
            for frame, code in before_open:
                assert await code_of(ws, frame) == code, frame
            await ws.send_json(OPEN)
            created = await answer(ws)
            assert created["type"] == "session.created", created
            after_open = [
                (OPEN, "invalid_request"),  # a second session.open
                ({"type": "step", "actions": "left"}, "invalid_request"),
                ({"type": "step", "actions": [[1, 2], [3]]}, "invalid_request"),
                ({"type": "step", "actions": acts(width=3)}, "invalid_request"),  # width
                ({"type": "teleport"}, "unknown_event"),
            ]
            for frame, code in after_open:
                assert await code_of(ws, frame) == code, frame
            # step_failed: the server cannot run it now (the pipeline admits one request
            # and another session's step of 100 denoising steps is running)
            other = await http.ws_connect("/v1/world?model=world")
            await other.send_json(OPEN)
            assert (await answer(other))["type"] == "session.created"
            await other.send_json({"type": "step", "actions": acts(), "steps": 100})
            assert (await other.receive_json(timeout=60))["type"] == "step.progress"
            assert await code_of(ws, {"type": "step", "actions": acts()}) == "step_failed"
            assert (await answer(other))["type"] == "chunk"
            await other.close()
            await ws.send_json({"type": "step", "actions": acts(), "seed": 1})
            assert (await answer(ws))["type"] == "chunk"  # the socket and the session stay
            server.inspect(lambda: omni.close_session(created["session"]["id"], "test"))
            assert await code_of(ws, {"type": "step", "actions": acts()}) == "session_error"
            # a bad view_point is the model's refusal of what the client sent
            bad_view = await http.ws_connect("/v1/world?model=world")
            await bad_view.send_json({**OPEN, "view_point": "from_the_moon"})
            assert (await answer(bad_view))["type"] == "session.created"
            assert await code_of(bad_view, {"type": "step", "actions": acts()}) \
                == "invalid_request"
            await ws.close()
            await bad_view.close()
    run(body())


def _doc_codes() -> set[str]:
    text = DOC.read_text()
    table = text[text.index("Error codes"):].split("\n\n")[1]  # the table after the line
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([a-z_]+)`", row).group(1) for row in rows}


def _codes_sent() -> set[str]:
    """Every code argument of a ClientError(...) / self.error(...) in omni/api/world.py:
    string literals and module constants alike (passing a ClientError's own code on)."""
    tree = ast.parse(Path(world.__file__).read_text())
    codes = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name not in ("ClientError", "error"):
            continue
        args = node.args[1:2] + [k.value for k in node.keywords if k.arg == "code"]
        for arg in args:
            if isinstance(arg, ast.Constant):
                codes.add(arg.value)
            elif isinstance(arg, ast.Name):
                codes.add(getattr(world, arg.id))
            elif ast.unparse(arg) == "exc.code":  # a ClientError's: one of those above
                continue
            else:
                raise AssertionError(f"line {node.lineno}: a code that is not a name or a "
                                     f"literal: {ast.unparse(arg)}")
    return codes


def test_every_code_sent_is_documented_and_every_documented_code_exists():
    documented = _doc_codes()
    assert documented == set(world.ERROR_CODES), documented ^ set(world.ERROR_CODES)
    sent = _codes_sent() | {world.INVALID_REQUEST}  # the default of both
    assert sent <= set(world.ERROR_CODES), sent - set(world.ERROR_CODES)


async def frames_of(ws, actions: list, seed: int = 1) -> np.ndarray:
    """The first chunk from the session's first frame (a reset before it)."""
    await ws.send_json({"type": "reset"})
    assert (await answer(ws))["type"] == "session.reset"
    await ws.send_json({"type": "step", "actions": actions, "seed": seed})
    while True:
        event = await ws.receive_json(timeout=60)
        if event["type"] == "chunk":
            assert event["index"] == 1
            data = await ws.receive_bytes(timeout=60)
            shape = (event["frames"], event["height"], event["width"], 3)
            return np.frombuffer(data, np.uint8).reshape(shape)
        assert event["type"] == "step.progress", event


async def opened(http, **extra):
    ws = await http.ws_connect("/v1/world?model=world")
    await ws.send_json({**OPEN, **extra})
    assert (await answer(ws))["type"] == "session.created"
    return ws


def test_view_point_reaches_the_model(server):
    async def body():
        async with server.session() as http:
            chunks = {}
            for view in (None, "ego_view", "wrist_view", "third_person_view"):
                ws = await opened(http, **({"view_point": view} if view else {}))
                chunks[view] = await frames_of(ws, acts())
                await ws.close()
        assert np.array_equal(chunks[None], chunks["ego_view"])  # the default
        assert not np.array_equal(chunks["ego_view"], chunks["wrist_view"])
        assert not np.array_equal(chunks["wrist_view"], chunks["third_person_view"])
    run(body())


def test_short_actions_repeat_their_last_row_and_long_ones_are_cut(server):
    rows = acts(rows=6)  # chunk_size 4 (the default): frames = 5

    async def body():
        async with server.session() as http:
            ws = await opened(http)
            two = await frames_of(ws, rows[:2])
            two_repeated = await frames_of(ws, rows[:2] + [rows[1]] * 2)
            two_other = await frames_of(ws, rows[:2] + [rows[4]] * 2)
            six = await frames_of(ws, rows)
            four = await frames_of(ws, rows[:4])
            await ws.close()
        assert two.shape == (5, 64, 64, 3)
        assert np.array_equal(two, two_repeated)
        assert not np.array_equal(two, two_other)  # the rows it stands for matter
        assert np.array_equal(six, four)
        assert not np.array_equal(four, two)
    run(body())
