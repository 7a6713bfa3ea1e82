"""Property tests of every WebSocket's client-event parsers: /v1/realtime and /v1/duplex
(omni/api/realtime/), OpenPI (omni/api/openpi/), /v1/world (omni/api/world.py). Whatever
a client sends, each parser returns a value or raises the error its connection turns
into an error event / error frame (ClientError, ConfigError, ValueError, KeyError as
documented at each), never anything else. Events are arbitrary JSON, arbitrary bytes,
and real events with fields replaced by arbitrary values. Bounded and derandomized.
"""

from __future__ import annotations

import base64
import json

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from omni.api.openpi import codec, parse_observation
from omni.api.realtime.audio_input import InputAudio
from omni.api.realtime.config import ClientError, ConfigError, SessionConfig
from omni.api.realtime.connection import parse_event
from omni.api.realtime.items import Item, Items, user_item
from omni.api.realtime.response import spec_from
from omni.api.world import ClientError as WorldClientError
from omni.api.world import first_frame, parse_actions
from omni.api.world import parse_event as parse_world_event
from omni.fixtures.media_bombs import png_declaring
from omni.media.image import encode_image

FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-2**70, 2**70)
                | st.floats() | st.text(max_size=10)
                | st.sampled_from(["text", "audio", "pcm16", "server_vad", "inf", "user",
                                   "message", "input_text", "input_audio", "auto"]))
json_values = st.recursive(json_scalars, lambda inner: (
    st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)

GA_SESSION = {"type": "realtime", "output_modalities": ["text"], "instructions": "be brief",
              "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                  "turn_detection": {"type": "server_vad", "threshold": 0.5},
                                  "transcription": None},
                        "output": {"voice": "alloy", "format": "pcm16"}},
              "max_output_tokens": 100, "temperature": 0.7}
BETA_SESSION = {"modalities": ["text", "audio"], "voice": "alloy",
                "input_audio_format": "pcm16", "output_audio_format": "pcm16",
                "turn_detection": None, "max_response_output_tokens": "inf",
                "input_audio_transcription": {"model": "whisper-1"}}
ITEM = {"type": "message", "role": "user", "id": "item_1",
        "content": [{"type": "input_text", "text": "hello"},
                    {"type": "input_audio", "audio": "AAAA", "transcript": None}]}

CALL = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"}
CALL_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "12:00"}



def _paths(value, prefix=()):
    """Every path (tuple of keys/indices) into a nested dict/list."""
    yield prefix
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _paths(inner, (*prefix, i))


@st.composite
def mutated(draw, base: dict) -> dict:
    """``base`` with up to three of its fields (at any depth) replaced by arbitrary JSON."""
    event = json.loads(json.dumps(base))
    paths = [p for p in _paths(event) if p]
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        parent = event
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):  # an earlier change removed the path
            pass
    return event


def _config() -> SessionConfig:
    return SessionConfig("chat", ["text"], "alloy", ("alloy", "echo"))


def _frames_of(strategy):
    return strategy.map(lambda v: json.dumps(v)) | st.text(max_size=40) | st.binary(max_size=40)


# -- realtime / duplex -------------------------------------------------------------------

@FUZZ
@given(_frames_of(json_values | mutated({"type": "session.update", "session": GA_SESSION})))
def test_realtime_frames_parse_to_a_typed_event_or_a_client_error(raw):
    try:
        event = parse_event(raw)
    except ClientError as exc:
        assert exc.code in ("invalid_json", "invalid_event")
        return
    assert isinstance(event, dict) and isinstance(event["type"], str)


@pytest.mark.parametrize("raw", ["[" * 100_000, '{"a":' * 50_000, b"\xff\xfe{}"])
def test_deep_or_undecodable_frames_are_client_errors(raw):
    with pytest.raises(ClientError, match="not valid JSON"):
        parse_event(raw)
    with pytest.raises(WorldClientError, match="not valid JSON"):
        parse_world_event(raw)


@FUZZ
@given(mutated(GA_SESSION) | mutated(BETA_SESSION) | json_values)
def test_session_update_applies_or_raises_config_error_changing_nothing(session):
    config = _config()
    before = dict(vars(config))
    try:
        config.update(session)
    except ConfigError as exc:
        assert exc.param.startswith("session")
        assert vars(config) == before
        return
    assert config.output_modalities in (["text"], ["audio"])
    json.dumps(config.render("s", beta=False)), json.dumps(config.render("s", beta=True))


@FUZZ
@given(mutated({"output_modalities": ["text"], "instructions": "x", "conversation": "auto",
                "max_output_tokens": 5, "temperature": 1.0,
                "audio": {"output": {"voice": "echo"}}}) | json_values)
def test_response_create_spec_or_config_error(raw):
    if not isinstance(raw, dict):  # the handler refuses those before spec_from
        return
    try:
        spec = spec_from(_config(), raw)
    except ConfigError:
        return
    assert spec.output_modalities in (["text"], ["audio"])


@FUZZ
@given(mutated(ITEM) | mutated(CALL) | mutated(CALL_OUTPUT) | json_values)
def test_item_create_builds_an_item_or_raises_value_error(content):
    try:
        item = user_item(content)
    except ValueError:
        return
    if item.type == "message":
        assert item.role in ("user", "assistant", "system") and item.parts
    else:  # a call's fields are strings, its ids not empty
        assert item.type in ("function_call", "function_call_output") and item.call["call_id"]
        assert all(isinstance(v, str) for v in item.call.values())
    json.dumps(item.render(beta=True))


@FUZZ
@given(st.lists(json_values, max_size=6))
@example(["item_x", None, 0, "", ["a"], {"a": "a"}, "A"])
def test_item_ids_that_name_nothing_raise_key_error(ids):
    items = Items()
    items.add(Item("a", "user", [{"type": "input_text", "text": "x"}]))
    items.add(Item("z", "assistant", [{"type": "output_text", "text": "y"}]))
    for item_id in ids:
        held = [item.id for item in items.order]
        if item_id in held:  # a generated "a" or "z" names an item
            continue
        operations = [items.get, items.delete]
        if item_id is not None:  # add(item, None) appends: None names the end, not an item
            operations.append(lambda i: items.add(Item("b", "user", []), i))
        for operation in operations:
            with pytest.raises(KeyError):
                operation(item_id)
            assert [item.id for item in items.order] == held  # nothing got, moved or added
    assert items.get("a").id == "a" and items.get("z").id == "z"  # real ids still name theirs


@FUZZ
@given(st.lists(st.binary(max_size=600), max_size=6))
def test_duplex_binary_frames_append_or_raise_value_error(frames):
    audio = InputAudio(max_seconds=0.02)  # 640 bytes at 16 kHz: the limit is reached too
    for frame in frames:
        try:
            pcm = audio.append(frame)
        except ValueError as exc:
            assert "16-bit" in str(exc) or "at most" in str(exc)
            continue
        assert len(pcm) % 2 == 0
    assert len(audio.buffer) <= audio.max_bytes


# -- world -------------------------------------------------------------------------------

FIRST = base64.b64encode(encode_image(np.zeros((8, 8, 3), np.uint8))).decode()


@FUZZ
@given(mutated({"type": "session.open", "prompt": "p", "domain": "d", "image": FIRST,
                "seed": 1})
       | st.sampled_from([png_declaring(60000, 60000), png_declaring(9000, 9000), b"\x89PNG"])
       .map(lambda png: {"type": "session.open", "image": base64.b64encode(png).decode()}))
def test_world_first_frame_is_a_small_image_or_a_client_error(event):
    try:
        image = first_frame(event)
    except WorldClientError:
        return
    assert image == base64.b64decode(FIRST)


@FUZZ
@given(mutated({"type": "step", "actions": [[0.1, 0.2], [0.3, 0.4]]}) | json_values)
def test_world_actions_are_a_float_matrix_or_a_client_error(event):
    actions = event.get("actions") if isinstance(event, dict) else event
    try:
        array = parse_actions(actions)
    except WorldClientError:
        return
    assert array.dtype == np.float32 and array.ndim == 2


# -- openpi ------------------------------------------------------------------------------

ndarray_fields = st.fixed_dictionaries({
    b"__ndarray__": st.just(True),
    b"data": st.binary(max_size=32),
    b"dtype": st.sampled_from(["<f4", "|u1", "<i8", "|b1", "U0", "S0", "V8", "O", "<c8",
                               "M8", "float128", "nope", ""]) | st.text(max_size=6),
    b"shape": st.lists(st.integers(-1, 2**64 - 1) | st.integers(0, 8), max_size=3)})
npgeneric_fields = st.fixed_dictionaries({
    b"__npgeneric__": st.just(True), b"data": json_scalars.filter(
        lambda v: not isinstance(v, int) or -2**63 <= v < 2**64),
    b"dtype": st.sampled_from(["<f4", "|i1", "<u8", "M8[s]", "O", "nope"])})


@st.composite
def observation_frames(draw) -> bytes:
    """A real observation (image, state, prompt) with some values replaced by arbitrary
    msgpack / numpy-convention maps."""
    observation = {"observation/image": np.zeros((4, 4, 3), np.uint8),
                   "observation/state": np.zeros(8, np.float32), "prompt": "pick", "seed": 3}
    for key in draw(st.lists(st.sampled_from(list(observation)), max_size=3)):
        observation[key] = draw(ndarray_fields | npgeneric_fields | json_values)
    try:
        return codec.packb(observation)
    except (ValueError, TypeError, OverflowError):  # refused by the client's own encoder
        return _pack_any(draw(json_values))


def _pack_any(value) -> bytes:
    """msgpack of a JSON value; its integers past 64 bits cannot be sent at all."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except OverflowError:
        return msgpack.packb(None)


@settings(FUZZ, max_examples=300)
@given(observation_frames() | st.binary(max_size=64)
       | json_values.map(_pack_any))
def test_openpi_frames_parse_or_raise_value_error(frame):
    try:
        seed, observation = parse_observation(frame)
    except ValueError as exc:
        assert str(exc)
        return
    assert isinstance(observation, dict) and "seed" not in observation
    msgpack.packb(observation, use_bin_type=True)  # what rides to the engine packs


def test_openpi_refuses_what_the_fuzz_found():
    def frame(**fields):
        return msgpack.packb({"x": {b"__ndarray__": True, **fields}}, use_bin_type=True)
    for bad in (frame(data=b"", dtype="<f4", shape=[2**64 - 1]),  # overflowed np.prod
                frame(data=b"", dtype="U0", shape=[2**40]),  # zero-size items
                msgpack.packb({"x": {b"__npgeneric__": True, b"data": 1000, b"dtype": "|i1"}}),
                msgpack.packb({"x": _nested(1020)})):  # deeper than Python recursion
        with pytest.raises(ValueError):
            parse_observation(bad)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value
