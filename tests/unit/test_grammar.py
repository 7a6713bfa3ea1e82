"""Structured output in the AR engine (omni/engines/ar/grammar.py) on the tiny random
Qwen3: whatever the weights, a json_schema answer parses and validates, constrained and
free rows share a step, a schema the library refuses fails only its request."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from omni.engines.ar import grammar
from omni.engines.ar.engine import AREngine
from omni.engines.ar.sampling import SamplingParams
from omni.engines.base import EngineRequest
from omni.fixtures import build_tiny_qwen3

torch.set_num_threads(1)

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "ok": {"type": "boolean"},
    "kind": {"enum": ["cat", "dog"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2}},
    "required": ["name", "age", "ok", "kind", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    # initializer_range 0.5: answers vary (with 0.02 they repeat one token)
    made = AREngine(str(build_tiny_qwen3(tmp_path_factory.mktemp("g") / "q",
                                         initializer_range=0.5)))
    yield made
    made.shutdown()


def run_all(engine, requests: dict[str, dict]) -> dict[str, tuple[str, str | None, list]]:
    for rid, params in requests.items():
        engine.add(EngineRequest(rid, {"prompt": f"Request {rid} says"}, params))
    outs: dict[str, list] = {}
    for step in range(1000):
        if not engine.has_work():
            break
        for o in engine.step():
            outs.setdefault(o.request_id, []).append((step, o))
    return {rid: ("".join(o.data["text"] for _, o in os_ if o.data), os_[-1][1].data and
                  os_[-1][1].data["finish_reason"], os_) for rid, os_ in outs.items()}


def test_json_schema_answers_validate_whatever_the_weights(engine):
    requests = {f"s{i}": {"json_schema": json.dumps(SCHEMA), "max_tokens": 200,
                          "temperature": 1.0, "seed": i} for i in range(8)}
    requests["greedy"] = {"json_schema": json.dumps(SCHEMA), "max_tokens": 200,
                          "temperature": 0.0}
    done = run_all(engine, requests)
    answers = []
    for _rid, (text, finish, _) in done.items():
        assert finish == "stop", text
        answers.append(json.loads(text))
        jsonschema.validate(answers[-1], SCHEMA)
    assert len({json.dumps(a) for a in answers}) > 1  # the rows really were sampled


def test_free_rows_unchanged_beside_constrained_ones(engine):
    free = {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True}
    alone = run_all(engine, {"free": free})["free"][0]
    both = run_all(engine, {"free": free, "json": {"json_schema": json.dumps(SCHEMA),
                                                   "max_tokens": 200, "temperature": 0.0}})
    assert both["free"][0] == alone and not alone.lstrip().startswith("{")
    jsonschema.validate(json.loads(both["json"][0]), SCHEMA)
    # one batch: the free row's tokens came out of the same step() calls as the json row's
    free_steps = {step for step, _ in both["free"][2]}
    assert len(free_steps & {step for step, _ in both["json"][2]}) >= len(free_steps) - 1


def test_json_object_is_an_object(engine):
    done = run_all(engine, {f"o{i}": {"json_schema": grammar.JSON_OBJECT_SCHEMA,
                                      "max_tokens": 120, "temperature": 1.0, "seed": i}
                            for i in range(6)})
    stopped = [text for text, finish, _ in done.values() if finish == "stop"]
    assert stopped  # a random model can wander in a key, but not every time
    for text in stopped:
        assert isinstance(json.loads(text), dict)
    for text, _, _ in done.values():
        assert text.startswith("{")


def test_refused_schema_fails_only_its_request(engine):
    bad = json.dumps({"type": "string", "pattern": "(?<=a)b"})
    done = run_all(engine, {"bad": {"json_schema": bad},
                            "good": {"max_tokens": 3, "temperature": 0.0}})
    assert done["bad"][2][-1][1].error and "json_schema" in done["bad"][2][-1][1].error
    assert done["good"][1] == "length"


def test_template_cache_is_bounded(engine, monkeypatch):
    monkeypatch.setattr(grammar, "MAX_COMPILED", 3)
    compiler = engine.grammars
    for n in range(6):
        compiler.matcher(SamplingParams(json_schema=json.dumps({"type": "integer", "maximum": n})))
    assert len(compiler._templates) == 3


def test_bitmask_bits_are_token_ids():
    mask = torch.zeros(2, 2, dtype=torch.int32)
    mask[0, 0] = 1 << 3
    mask[1, 1] = 1 << 4  # token 36
    bias = grammar.refusal_bias(mask, 40)
    assert bias.shape == (2, 40)
    assert (bias[0] == 0).nonzero().flatten().tolist() == [3]
    assert (bias[1] == 0).nonzero().flatten().tolist() == [36]
    assert bool((bias[bias != 0] == float("-inf")).all())
    words = torch.randint(-2**31, 2**31 - 1, (3, 5), dtype=torch.int32)  # every bit
    want = torch.tensor([[bool((int(w) >> b) & 1) for w in row for b in range(32)]
                         for row in words.tolist()])
    assert torch.equal(grammar.refusal_bias(words, 160) == 0, want)


def test_overlapped_steps_mask_after_the_previous_token(tmp_path):
    """With overlap (CUDA's default) a step is sampled a call after its launch: the mask
    must still follow every token taken before it, or the answer would not parse."""
    model = build_tiny_qwen3(tmp_path / "q", initializer_range=0.5)
    engine = AREngine(str(model), options={"overlap_steps": True, "chain_decode": True})
    try:
        assert engine.runner.overlap
        requests = {f"s{i}": {"json_schema": json.dumps(SCHEMA), "max_tokens": 200,
                              "temperature": 1.0, "seed": i} for i in range(4)}
        requests["free"] = {"max_tokens": 20, "temperature": 0.0, "ignore_eos": True}
        done = run_all(engine, requests)
        for rid, (text, finish, _) in done.items():
            if rid != "free":
                assert finish == "stop", text
                jsonschema.validate(json.loads(text), SCHEMA)
        assert done["free"][1] == "length"
    finally:
        engine.shutdown()
