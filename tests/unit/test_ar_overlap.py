"""Overlapped steps (AR option overlap_steps, on by default on CUDA): step() builds the
outputs of one step while the next runs. On a CPU the forward is synchronous, so these
tests check the bookkeeping, not the speed: every output equals the engine's that finishes
each step before scheduling the next."""

from __future__ import annotations

import pytest
import torch

from omni.engines.ar.engine import AREngine
from omni.engines.base import EngineRequest, StepOutput
from omni.fixtures import build_tiny_qwen3

torch.set_num_threads(1)

PROMPTS = ["Hello world, this is", "Tell me a story about a robot who", "One",
           "The quick brown fox jumps over the lazy dog and then runs far away into"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # a larger init than the default: greedy answers that vary, so order and positions count
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("overlap") / "qwen3",
                                initializer_range=0.5))


def engines(model_dir: str, chain: bool = False, **options) -> tuple[AREngine, AREngine]:
    """(one step at a time, overlapped (and chained)) on the same model."""
    return (AREngine(model_dir, options={**options, "overlap_steps": False}),
            AREngine(model_dir, options={**options, "overlap_steps": True,
                                         "chain_decode": chain}))


def drive(engine: AREngine, requests: list[tuple[int, str, dict, dict]],
          abort: tuple[int, str] | None = None) -> dict[str, list[StepOutput]]:
    """Add each (call number, id, inputs, params) before that step() call; abort one id
    before a given call; run until idle. Outputs per request, checked for order."""
    outs: dict[str, list[StepOutput]] = {}
    call = 0
    while call < 500:
        for at, rid, inputs, params in requests:
            if at == call:
                engine.add(EngineRequest(rid, inputs, params))
        if abort and abort[0] == call:
            engine.abort([abort[1]])
        if call > max(at for at, *_ in requests) and not engine.has_work():
            return outs
        for o in engine.step():
            assert o.error is None, o.error
            assert not outs.get(o.request_id) or not outs[o.request_id][-1].finished, o
            outs.setdefault(o.request_id, []).append(o)
        call += 1
    raise AssertionError("engine did not finish")


def merged(outs: list[StepOutput]) -> dict:
    """A request's outputs as one record: everything the API would send for it."""
    hidden = [o.data["hidden_states"] for o in outs if "hidden_states" in o.data]
    return {"tokens": [t for o in outs for t in o.data["token_ids"]],
            "text": "".join(o.data["text"] for o in outs),
            "finish": outs[-1].data["finish_reason"], "finished": outs[-1].finished,
            "usage": (outs[0].data.get("prompt_tokens"), outs[-1].data.get("completion_tokens")),
            "logprobs": [e for o in outs for e in o.data.get("logprobs", [])],
            "hidden": torch.cat(hidden) if hidden else None}


def assert_same(a: dict[str, list[StepOutput]], b: dict[str, list[StepOutput]]) -> None:
    assert set(a) == set(b)
    for rid in a:
        x, y = merged(a[rid]), merged(b[rid])
        hx, hy = x.pop("hidden"), y.pop("hidden")
        assert x == y, rid
        assert (hx is None) == (hy is None) and (hx is None or torch.equal(hx, hy)), rid


@pytest.mark.parametrize("chain", [False, True])
def test_overlapped_outputs_equal_step_by_step(model_dir, chain):
    plain, over = engines(model_dir, chain)
    full = merged(drive(plain, [(0, "r", {"prompt": PROMPTS[1]},
                                 {"temperature": 0, "max_tokens": 24, "ignore_eos": True})])["r"])
    stop = next(full["text"][k:k + 3] for k in range(8, len(full["text"]) - 3)
                if "\ufffd" not in full["text"][k:k + 3] and full["text"][k:k + 3].strip())
    requests = [
        (0, "greedy", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 12,
                                               "ignore_eos": True}),
        (0, "seeded", {"prompt": PROMPTS[2]}, {"temperature": 1.0, "top_p": 0.9, "seed": 3,
                                               "max_tokens": 10, "ignore_eos": True}),
        (1, "stop", {"prompt": PROMPTS[1]}, {"temperature": 0, "max_tokens": 24,
                                             "ignore_eos": True, "stop": [stop]}),
        (2, "penalties", {"prompt": PROMPTS[3]}, {"temperature": 0, "max_tokens": 9,
                                                  "repetition_penalty": 1.3,
                                                  "presence_penalty": 0.5, "ignore_eos": True}),
        (4, "logprobs", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 5,
                                                 "logprobs": 2, "ignore_eos": True}),
    ]
    want, got = drive(plain, requests), drive(over, requests)
    assert_same(want, got)
    # the stop string ended that request while its next row was already running
    assert merged(got["stop"])["finish"] == "stop" and len(merged(got["stop"])["tokens"]) < 24
    for engine in (plain, over):
        assert not engine.has_work() and engine.stats()["kv_blocks_used"] == 0


def test_tokens_come_one_call_later(model_dir):
    plain, over = engines(model_dir)
    for engine in (plain, over):
        engine.add(EngineRequest("r", {"prompt": PROMPTS[0]}, {"temperature": 0,
                                                                "max_tokens": 3}))
    assert [o.request_id for o in plain.step()] == ["r"]
    assert over.step() == [] and over.has_work()  # launched, sampled at the next call
    assert [o.request_id for o in over.step()] == ["r"]
    for engine in (plain, over):
        engine.abort(["r"])
        assert engine.stats()["kv_blocks_used"] == 0


def test_outputs_go_out_before_a_prompt_step_is_launched(model_dir):
    """A prefill's eager forward can hold the host for the whole step (a MoE's routing
    syncs): the outputs in hand, here a's first token, are returned before it starts."""
    plain, over = engines(model_dir)
    params = {"temperature": 0, "max_tokens": 5, "ignore_eos": True}
    over.add(EngineRequest("a", {"prompt": PROMPTS[0]}, params))
    assert over.step() == []  # a's prefill launched
    over.add(EngineRequest("b", {"prompt": PROMPTS[1]}, params))
    assert [o.request_id for o in over.step()] == ["a"]
    assert over.runner.inflight is None  # b's prefill (with a's decode) waits for the next call
    assert over.step() == [] and over.runner.inflight is not None
    rest: dict[str, list[int]] = {}
    while over.has_work():
        for o in over.step():
            rest.setdefault(o.request_id, []).extend(o.data["token_ids"])
    want = drive(plain, [(0, "a", {"prompt": PROMPTS[0]}, params),
                         (1, "b", {"prompt": PROMPTS[1]}, params)])
    assert rest["a"] == merged(want["a"])["tokens"][1:]
    assert rest["b"] == merged(want["b"])["tokens"]


def test_a_request_without_a_free_row_does_not_stop_the_overlap(model_dir):
    """Only a waiting request that the next step can admit holds the launch back."""
    _, over = engines(model_dir, max_num_seqs=1)
    params = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    over.add(EngineRequest("a", {"prompt": PROMPTS[0]}, params))
    assert over.step() == []
    over.add(EngineRequest("b", {"prompt": PROMPTS[1]}, params))  # no row for it yet
    assert [o.request_id for o in over.step()] == ["a"] and over.runner.inflight is not None
    done = set()
    while over.has_work():
        done |= {o.request_id for o in over.step() if o.finished}
    assert done == {"a", "b"} and over.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("chain", [False, True])
def test_abort_while_a_step_is_in_flight(model_dir, chain):
    plain, over = engines(model_dir, chain)
    params = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}
    requests = [(0, "keep", {"prompt": PROMPTS[0]}, params),
                (0, "drop", {"prompt": PROMPTS[1]}, params)]
    got = drive(over, requests, abort=(4, "drop"))
    assert len(merged(got["drop"])["tokens"]) == 3  # the row in flight at the abort: dropped
    assert merged(got["keep"]) == merged(drive(plain, requests[:1])["keep"])
    assert not over.has_work() and over.stats()["kv_blocks_used"] == 0


def test_hidden_state_export_overlapped(model_dir):
    plain, over = engines(model_dir, export_hidden_layers=[0, -1], max_batched_tokens=6)
    params = {"temperature": 0, "max_tokens": 4, "ignore_eos": True}
    requests = [(0, "a", {"prompt": PROMPTS[3]}, params), (1, "b", {"prompt": PROMPTS[0]},
                                                            {**params, "max_tokens": 6})]
    want, got = drive(plain, requests), drive(over, requests)
    assert_same(want, got)
    ids = plain.lm.tokenizer(PROMPTS[3])["input_ids"]
    shapes = [tuple(o.data["hidden_states"].shape)[:2] for o in got["a"]]
    assert shapes == [(len(ids), 2)] + [(1, 2)] * 3  # each output: the tokens fed since


def test_chained_greedy_decode(model_dir, caplog):
    """Greedy rows chain (each step fed the token the device picked before the host reads
    it); requests ending by length, stop token, stop string and abort break the chain and
    lose only their in-flight row; the blocks published meanwhile serve a later prefix."""
    plain, chained = engines(model_dir, chain=True, block_size=4)
    greedy = {"temperature": 0, "ignore_eos": True}
    probe = merged(drive(plain, [(0, "p", {"prompt": PROMPTS[2]}, {**greedy, "max_tokens": 12})])["p"])
    requests = [(0, "long", {"prompt": PROMPTS[0]}, {**greedy, "max_tokens": 30}),
                (0, "short", {"prompt": PROMPTS[1]}, {**greedy, "max_tokens": 7}),
                (0, "token", {"prompt": PROMPTS[2]}, {**greedy, "max_tokens": 20,
                                                      "stop_token_ids": [probe["tokens"][5]]}),
                (0, "string", {"prompt": PROMPTS[2]}, {**greedy, "max_tokens": 20,
                                                       "stop": [probe["text"][-6:-2]]}),
                (0, "aborted", {"prompt": PROMPTS[3]}, {**greedy, "max_tokens": 30})]
    want = drive(plain, requests, abort=(15, "aborted"))
    got = drive(chained, requests, abort=(15, "aborted"))
    assert chained.stats()["chained_steps"] >= 10
    assert "chained decode step failed" not in caplog.text
    aborted = merged(got.pop("aborted"))["tokens"]
    assert aborted == merged(want.pop("aborted"))["tokens"][:len(aborted)]
    assert_same(want, got)
    assert merged(got["token"])["finish"] == merged(got["string"])["finish"] == "stop"
    assert not chained.has_work() and chained.stats()["kv_blocks_used"] == 0
    # the prompt + answer of "long" as a new prompt: its blocks, published by chained
    # steps, are reused and must hold that text's KV
    ids = chained.lm.tokenizer(PROMPTS[0])["input_ids"] + merged(got["long"])["tokens"]
    again = [(0, "again", {"prompt_token_ids": ids}, {**greedy, "max_tokens": 8})]
    hits = chained.stats()["prefix_cache_hits"]
    assert merged(drive(chained, again)["again"]) == merged(drive(plain, again)["again"])
    assert chained.stats()["prefix_cache_hits"] > hits


def test_chain_waits_for_sampling_rows_and_new_requests(model_dir):
    _, chained = engines(model_dir, chain=True)
    requests = [(0, "g", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 6,
                                                  "ignore_eos": True}),
                (0, "s", {"prompt": PROMPTS[1]}, {"temperature": 1.0, "seed": 1,
                                                  "max_tokens": 6, "ignore_eos": True})]
    drive(chained, requests)
    assert chained.stats()["chained_steps"] == 0  # a sampled row is picked on the host
    drive(chained, [(0, "a", {"prompt": PROMPTS[0]}, {"temperature": 0, "max_tokens": 8,
                                                      "ignore_eos": True}),
                    (3, "b", {"prompt": PROMPTS[1]}, {"temperature": 0, "max_tokens": 8,
                                                      "ignore_eos": True})])
    assert chained.stats()["chained_steps"] > 0 and chained.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("chain", [False, True])
def test_output_limit_holds_a_request(model_dir, chain):
    """Engine.limit (omni/runtime/lead.py): a request stops at its limit (the engine goes idle if
    nothing else runs), goes on when it is raised or lifted, and says the same tokens; a
    request beside it is not held. Step by step, overlapped and chained."""
    greedy = {"temperature": 0, "ignore_eos": True, "max_tokens": 12}
    plain, overlapped = engines(model_dir, chain=chain)
    want = merged(drive(plain, [(0, "a", {"prompt": PROMPTS[0]}, greedy)])["a"])["tokens"]
    for engine in (plain, overlapped):
        engine.add(EngineRequest("a", {"prompt": PROMPTS[0]}, greedy))
        engine.add(EngineRequest("b", {"prompt": PROMPTS[1]}, greedy))
        engine.limit({"a": 3, "unknown": 1})
        got: dict[str, list[int]] = {"a": [], "b": []}
        until_idle(engine, got)
        assert (len(got["a"]), len(got["b"])) == (3, 12)
        engine.limit({"a": 7})
        until_idle(engine, got)
        assert len(got["a"]) == 7
        engine.limit({"a": None})
        until_idle(engine, got)
        assert got["a"] == want and engine.stats()["kv_blocks_used"] == 0


def until_idle(engine: AREngine, got: dict[str, list[int]]) -> None:
    for _ in range(100):
        if not engine.has_work():
            return
        for o in engine.step():
            got[o.request_id] += o.data["token_ids"]
    raise AssertionError("engine did not go idle")
