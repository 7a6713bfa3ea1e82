"""A session's KV blocks held by the AR engine between turns (omni/engines/ar/session_kv.py),
in-process on the tiny Qwen3: the next turn prefills only its new tokens even after other
requests pushed every cached prefix out, its answer equals a fresh engine's, and
releasing gives every block back."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3

torch.set_num_threads(1)

OPTIONS = {"kv_cache_blocks": 40, "block_size": 4, "max_num_seqs": 4}
GREEDY = {"temperature": 0.0, "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("ars") / "qwen3",
                                initializer_range=0.5))


@pytest.fixture
def engine(model_dir):
    made = AREngine(model_dir, options=OPTIONS)
    yield made
    made.shutdown()


def run(engine, rid, ids, **params):
    engine.add(EngineRequest(rid, {"prompt_token_ids": ids}, {**GREEDY, **params}))
    outs = []
    for _ in range(200):
        if not engine.has_work():
            break
        outs += [o for o in engine.step() if o.request_id == rid]
    assert outs and outs[-1].finished and outs[-1].error is None, outs[-1:]
    return [t for o in outs for t in o.data["token_ids"]], outs[0].data["cached_tokens"]


def pressure(engine, rounds=6):
    """Distinct prompts that, one after another, take every block the pool can give."""
    for i in range(rounds):
        run(engine, f"other{i}", [(7 * i + j) % 90 + 5 for j in range(60)], max_tokens=2)


PROMPT = [(3 * j) % 97 + 2 for j in range(41)]


def test_next_turn_prefills_only_new_tokens_under_cache_pressure(engine, model_dir):
    answer, cached = run(engine, "t1", PROMPT, session="s")
    assert cached == 0 and len(set(answer)) > 2  # the model's answers vary
    held = engine.session_kv.nbytes()["s"]
    assert held == engine.cache.blocks_for(len(PROMPT) + len(answer) - 1) * engine.cache.block_bytes
    pressure(engine)
    follow = PROMPT + answer + [11, 12, 13, 14, 15]
    second, cached = run(engine, "t2", follow, session="s")
    assert cached == len(PROMPT) + len(answer) - 1  # only the new tokens (and the last) ran
    fresh = AREngine(model_dir, options=OPTIONS)
    try:
        assert run(fresh, "f", follow)[0] == second  # the held KV is the right KV
    finally:
        fresh.shutdown()
    assert engine.stats()["session_reused_tokens"] == cached


def test_without_a_session_the_same_pressure_evicts_the_prefix(engine):
    answer, _ = run(engine, "t1", PROMPT)
    assert run(engine, "t1b", PROMPT)[1] > 0  # cached, until the pressure comes
    pressure(engine)
    assert run(engine, "t2", PROMPT + answer + [11, 12])[1] == 0


def test_a_prompt_that_diverges_mid_block_copies_the_block(engine, model_dir):
    answer, _ = run(engine, "t1", PROMPT, session="s")
    edited = PROMPT[:30] + [1, 2, 3] + PROMPT[33:] + answer  # diverges at 30 (block 7, row 2)
    second, cached = run(engine, "t2", edited, session="s")
    assert cached == 30
    fresh = AREngine(model_dir, options=OPTIONS)
    try:
        assert run(fresh, "f", edited)[0] == second
    finally:
        fresh.shutdown()


def test_release_and_abort_give_blocks_back(engine):
    run(engine, "t1", PROMPT, session="s")
    assert engine.cache.pool.used > 0
    assert engine.end_session("s", "close") and not engine.end_session("s", "close")
    assert engine.stats()["session_bytes"] == {} and engine.cache.pool.used == 0
    engine.add(EngineRequest("t2", {"prompt_token_ids": PROMPT}, {**GREEDY, "session": "s"}))
    engine.step()  # prefilled, then cancelled mid-answer: what it computed stays held
    engine.abort(["t2"])
    assert engine.stats()["session_bytes"]["s"] > 0
    engine.end_session("s", "reset")
    assert engine.cache.pool.used == 0


def test_a_bad_session_param_fails_the_request_alone(engine):
    engine.add(EngineRequest("bad", {"prompt_token_ids": PROMPT}, {"session": 5}))
    out = engine.step()
    assert out[0].error and "session" in out[0].error
