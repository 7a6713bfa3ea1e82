"""omni.engines.ar.sampling: params, batched sampling (checked against transformers'
own logits processors) and incremental detokenization on the tiny Qwen3 tokenizer."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer
from transformers.generation import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from omni.engines.ar.detokenizer import IncrementalDetokenizer
from omni.engines.ar.sampling import (
    SamplingParams,
    SequenceSampler,
    processed_logits,
    sample,
)
from omni.fixtures.tiny_models import ensure_tiny_model

torch.set_num_threads(1)
V = 512


def seq(prompt=(1, 2, 3), outputs=(), **params) -> SequenceSampler:
    s = SequenceSampler(SamplingParams(**params), list(prompt), "cpu")
    for t in outputs:
        s.append(t)
    return s


# -- params ---------------------------------------------------------------------------

def test_params_defaults_and_normalisation():
    p = SamplingParams.from_dict({"stop": "x", "top_k": -1, "unknown": 1, "seed": None,
                                  "temperature": 0, "stop_token_ids": [5]})
    assert (p.max_tokens, p.min_tokens, p.top_p, p.min_p) == (16, 0, 1.0, 0.0)
    assert p.stop == ("x",) and p.top_k == 0 and p.seed is None and p.greedy
    assert p.stop_token_ids == (5,) and isinstance(p.temperature, float)
    assert SamplingParams.from_dict({"stop": ["a", "b"]}).stop == ("a", "b")


@pytest.mark.parametrize("field, value", [
    ("max_tokens", 0), ("max_tokens", True), ("max_tokens", 1.5), ("min_tokens", -1),
    ("min_tokens", 17), ("temperature", -0.1), ("temperature", float("nan")),
    ("temperature", float("inf")), ("temperature", "1"), ("top_p", 0), ("top_p", 1.01),
    ("top_k", -2), ("top_k", 2.0), ("min_p", 1.5), ("repetition_penalty", 0),
    ("presence_penalty", 2.5), ("frequency_penalty", -3), ("frequency_penalty", True),
    ("seed", -1), ("seed", 2**63), ("seed", "1"), ("stop", ""), ("stop", ["a", ""]),
    ("stop", ["s"] * 17), ("stop", 3), ("stop_token_ids", [-1]), ("stop_token_ids", [True]),
    ("ignore_eos", 1), ("logprobs", 21), ("logprobs", -1), ("logprobs", False),
])
def test_params_reject_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


# -- equivalence with transformers ----------------------------------------------------

ROWS = [  # one request per row; mixes every processor with neutral values
    dict(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.3),
    dict(temperature=1.3, top_p=0.5),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.5, min_p=0.2, repetition_penalty=0.8),
    dict(temperature=1.0),
    dict(temperature=2.0, top_k=100, top_p=0.95, repetition_penalty=1.1),
    dict(temperature=0.9, top_k=V + 10, top_p=0.3, min_p=0.01),
    dict(temperature=1.0, top_p=0.999, repetition_penalty=2.0),
]


def hf_processed(logits_row, p: SamplingParams, input_ids):
    procs = LogitsProcessorList()
    if p.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(p.repetition_penalty))
    if p.temperature != 1.0:
        procs.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k:
        procs.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        procs.append(TopPLogitsWarper(p.top_p))
    if p.min_p:
        procs.append(MinPLogitsWarper(p.min_p))
    return procs(torch.tensor([input_ids]), logits_row[None].clone())[0]


@pytest.mark.parametrize("batch", [1, 8])
def test_processed_logits_match_transformers(batch):
    g = torch.Generator().manual_seed(batch)
    logits = torch.randn(batch, V, generator=g) * 4
    seqs, inputs = [], []
    for i in range(batch):
        prompt = torch.randint(0, V, (30,), generator=g).tolist()
        outputs = torch.randint(0, V, (10,), generator=g).tolist()
        seqs.append(seq(prompt, outputs, **ROWS[i]))
        inputs.append(prompt + outputs)
    before = logits.clone()
    ours = processed_logits(logits, seqs)
    assert torch.equal(logits, before)  # the caller's logits are not touched
    for i in range(batch):
        ref = hf_processed(logits[i], seqs[i].params, inputs[i])
        assert torch.equal(torch.isinf(ours[i]), torch.isinf(ref)), f"row {i}"
        torch.testing.assert_close(torch.softmax(ours[i], -1), torch.softmax(ref, -1))
        assert torch.isfinite(ours[i]).sum() >= 1


def test_greedy_with_repetition_penalty_picks_hf_token():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(8, V, generator=g)
    seqs, picks = [], []
    for i in range(8):
        top2 = logits[i].topk(2).indices.tolist()  # penalise the argmax: the pick must move
        s = seq([top2[0], 7], [9], temperature=0, repetition_penalty=1.5 + i)
        seqs.append(s)
        ref = hf_processed(logits[i], SamplingParams(repetition_penalty=1.5 + i),
                           [top2[0], 7, 9])
        picks.append(int(ref.argmax()))
    assert [s.token for s in sample(logits, seqs)] == picks
    assert picks[0] != int(logits[0].argmax())


# -- seeds, penalties, min_tokens, logprobs -------------------------------------------

def run(logits_rows, seqs, steps=6):
    """Sample `steps` tokens for each seq; row i always sees logits_rows[i]."""
    out = [[] for _ in seqs]
    for _ in range(steps):
        for i, s in enumerate(sample(logits_rows, seqs)):
            seqs[i].append(s.token)
            out[i].append(s.token)
    return out


def test_seed_reproduces_whatever_the_batch():
    g = torch.Generator().manual_seed(0)
    row = torch.randn(V, generator=g)
    alone = run(row[None], [seq(seed=1234, top_p=0.95)])[0]
    torch.manual_seed(99)  # the unseeded neighbours draw from the global RNG
    mates = torch.randn(7, V, generator=g)
    batch = torch.cat([mates[:3], row[None], mates[3:]])
    seqs = [seq(seed=None) for _ in range(3)] + [seq(seed=1234, top_p=0.95)] + \
        [seq(seed=7), seq(seed=None, temperature=0), seq(seed=8, top_k=3), seq()]
    assert run(batch, seqs)[3] == alone
    assert run(torch.stack([row, row]), [seq(seed=1234, top_p=0.95), seq(seed=1)])[0] == alone
    others = [run(row[None], [seq(seed=s, top_p=0.95)])[0] for s in (1, 2, 3)]
    assert any(o != alone for o in others)


def test_presence_frequency_by_hand():
    logits = torch.zeros(1, 8)
    s = seq(prompt=[5], outputs=[1, 2, 2, 2], presence_penalty=0.5, frequency_penalty=0.25)
    out = processed_logits(logits, [s])[0]
    expected = torch.zeros(8)
    expected[1] = -(0.5 + 0.25 * 1)
    expected[2] = -(0.5 + 0.25 * 3)  # token 5 is only in the prompt: OpenAI leaves it alone
    assert torch.equal(out, expected)
    neg = seq(outputs=[3], presence_penalty=-1.0, frequency_penalty=-2.0)
    assert processed_logits(logits, [neg])[0, 3] == 3.0


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.zeros(2, 8)
    logits[:, 7] = 50.0  # eos would win
    logits[:, 6] = 40.0  # stop id next
    logits[:, 5] = 30.0
    s = seq(min_tokens=2, stop_token_ids=[6], temperature=0)
    free = seq(temperature=0)
    out = processed_logits(logits, [s, free], eos_ids={7})
    assert out[0, 7] == out[0, 6] == -math.inf and out[1, 7] == 50
    assert [x.token for x in sample(logits, [s, free], {7})] == [5, 7]
    s.append(0)
    s.append(0)
    assert sample(logits[:1], [s], {7})[0].token == 7  # min_tokens reached


def test_plain_greedy_batch_is_the_argmax_of_the_processed_logits():
    """All-greedy batches without penalties take a one-argmax path; a row with a penalty
    or an active min_tokens sends the batch through the full processing."""
    torch.manual_seed(3)
    logits = torch.randn(6, V, dtype=torch.bfloat16)
    plain = [seq(temperature=0) for _ in range(6)]
    want = processed_logits(logits.float(), plain).argmax(dim=-1).tolist()
    assert [x.token for x in sample(logits, plain)] == want
    assert all(x.logprobs is None for x in sample(logits, plain))
    mixed = plain[:5] + [seq(outputs=(int(want[5]),), temperature=0, repetition_penalty=5.0)]
    tokens = [x.token for x in sample(logits.float(), mixed)]
    assert tokens[:5] == want[:5] and tokens[5] != want[5]  # the penalty applied


@pytest.mark.parametrize("batch", [1, 8])
def test_logprobs_are_raw_log_softmax(batch):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(batch, V, generator=g).to(torch.bfloat16)
    seqs = [seq(logprobs=i % 4 if i != 5 else None, temperature=0.5, repetition_penalty=1.2)
            for i in range(batch)]
    ref = torch.log_softmax(logits.float(), -1)
    for i, out in enumerate(sample(logits, seqs)):
        if seqs[i].params.logprobs is None:
            assert out.logprobs is None
            continue
        lp = out.logprobs
        assert lp.token == out.token
        assert lp.logprob == pytest.approx(ref[i, out.token].item(), abs=1e-6)
        assert len(lp.top) == seqs[i].params.logprobs
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        for tok, v in lp.top:
            assert v == pytest.approx(ref[i, tok].item(), abs=1e-6)
        if lp.top:
            assert lp.top[0][0] == int(ref[i].argmax())


def test_top_k_one_is_greedy_and_empty_batch():
    logits = torch.randn(3, V)
    seqs = [seq(top_k=1, seed=i) for i in range(3)]
    assert [s.token for s in sample(logits, seqs)] == logits.argmax(-1).tolist()
    assert sample(torch.empty(0, V), []) == []
    with pytest.raises(ValueError):
        sample(logits, seqs[:2])


# -- incremental detokenization -------------------------------------------------------

class WithoutBackend:
    """The same tokenizer seen without its Rust backend (as a slow tokenizer is): the
    detokenizer then re-decodes a window instead of using tokenizers' DecodeStream."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __getattr__(self, name):
        if name == "backend_tokenizer":
            raise AttributeError(name)
        return getattr(self._tokenizer, name)

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)


@pytest.fixture(scope="module", params=["decode_stream", "window"])
def tok(tmp_path_factory, request):
    loaded = AutoTokenizer.from_pretrained(
        ensure_tiny_model("qwen3", tmp_path_factory.mktemp("m")))
    assert loaded.backend_tokenizer is not None
    return loaded if request.param == "decode_stream" else WithoutBackend(loaded)


def stream(tok, ids, stop=(), final_with_last=True):
    d = IncrementalDetokenizer(tok, stop)
    pieces, stopped = [], False
    for i, t in enumerate(ids):
        delta, stopped = d.push([t], final=final_with_last and i == len(ids) - 1)
        assert "\ufffd" not in delta
        pieces.append(delta)
        if stopped:
            break
    return d, pieces, stopped


TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Café au lait, naïve résumé: é è ü ß", "日本語のテキスト 日本", "emoji 🙂🚀 and 👍🏽 done"]


@pytest.mark.parametrize("text", TEXTS)
def test_detok_one_by_one_equals_decode(tok, text):
    ids = tok(text)["input_ids"]
    d, pieces, stopped = stream(tok, ids)
    assert not stopped
    assert "".join(pieces) == d.text == tok.decode(ids, skip_special_tokens=True) == text


def test_detok_multibyte_waits_for_whole_char(tok):
    ids = tok("🙂")["input_ids"]
    assert len(ids) > 1  # byte-level pieces of one character
    d = IncrementalDetokenizer(tok)
    assert [d.push([t])[0] for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert d.push(ids[-1:]) == ("🙂", False)
    partial = IncrementalDetokenizer(tok)
    partial.push(ids[:1])
    assert partial.push([], final=True)[0] == "\ufffd"  # final flushes even a broken char


def test_detok_stop_spanning_tokens_is_cut_and_never_leaked(tok):
    text = "Hello world! This is a tiny test"
    ids = tok(text)["input_ids"]
    pieces = [tok.decode([t]) for t in ids]
    stop = "world! Th"
    assert not any(stop in p for p in pieces)  # it really spans tokens
    d, out, stopped = stream(tok, ids, stop=[stop, "never"])
    assert stopped and "".join(out) == d.text == "Hello "
    assert d.push([ids[-1]]) == ("", True)  # nothing after a stop


def test_detok_holdback_released_and_final_flush(tok):
    ids = tok("the quick brown fox")["input_ids"]
    d, out, stopped = stream(tok, ids, stop=["brown cow", "fox jumps"], final_with_last=False)
    assert not stopped and "".join(out) == "the quick brown "  # "fox" could start a stop
    assert d.push([], final=True) == ("fox", False)
    assert d.text == "the quick brown fox"
    # a stop string that completes inside the last token is still cut
    d2, out2, stopped2 = stream(tok, ids, stop=["ck bro"])
    assert stopped2 and "".join(out2) == "the qui"
