"""Tiny Qwen3-Omni-MoE fixture (release layout) and the code2wav loader of its adapter."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from omni.engines.base import EngineLoadError
from omni.fixtures import FIXTURE_MARKER, TINY_MODELS, ensure_tiny_model
from omni.models.qwen3_omni import SAMPLE_RATE, Code2WavRunner, load_code2wav

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
    # session-wide cache dir: the test_generation_*.py modules reuse the same build
    return ensure_tiny_model("qwen3_omni", cache_dir=tmp_path_factory.getbasetemp() / "models")


@pytest.fixture(scope="module")
def c2w(omni_dir):
    return load_code2wav(str(omni_dir))


def _saved(d) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("model-*-of-*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_release_files(omni_dir):
    assert "qwen3_omni" in TINY_MODELS
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
                 "preprocessor_config.json", "model.safetensors.index.json", FIXTURE_MARKER):
        assert (omni_dir / name).is_file(), name
    assert not (omni_dir / "model.safetensors").exists()
    shards = sorted(p.name for p in omni_dir.glob("model-*-of-*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((omni_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == set(shards)
    assert {k.split(".", 1)[0] for k in index} == {"thinker", "talker", "code2wav"}
    assert any(".experts.0.gate_proj." in k for k in index)  # release (per-expert) layout
    cfg = json.loads((omni_dir / "config.json").read_text())
    assert cfg["model_type"] == "qwen3_omni_moe"
    marker = json.loads((omni_dir / FIXTURE_MARKER).read_text())
    assert marker["random_weights"] and marker["builder"] == "qwen3_omni"


def test_tokenizer_matches_config(omni_dir):
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(omni_dir))
    cfg = AutoConfig.from_pretrained(str(omni_dir))
    th = cfg.thinker_config
    expect = {"<|im_start|>": cfg.im_start_token_id, "<|im_end|>": cfg.im_end_token_id,
              "<tts_pad>": cfg.tts_pad_token_id, "<tts_text_bos>": cfg.tts_bos_token_id,
              "<tts_text_eod>": cfg.tts_eos_token_id, "<|audio_pad|>": th.audio_token_id,
              "<|image_pad|>": th.image_token_id, "<|video_pad|>": th.video_token_id,
              "<|audio_start|>": th.audio_start_token_id, "<|audio_end|>": th.audio_end_token_id,
              "<|vision_start|>": th.vision_start_token_id,
              "<|vision_end|>": th.vision_end_token_id}
    for token, tid in expect.items():
        assert tok.convert_tokens_to_ids(token) == tid, token
        assert tok.decode([tid]) == token
    for word in ("system", "user", "assistant"):
        assert tok(word)["input_ids"] == [getattr(cfg, f"{word}_token_id")]
    assert th.text_config.vocab_size >= len(tok)
    ids = tok.apply_chat_template([{"role": "user", "content": [
        {"type": "audio"}, {"type": "text", "text": "hello"}]}], add_generation_prompt=True,
        tokenize=True, return_dict=False)
    assert ids[:2] == [cfg.im_start_token_id, cfg.user_token_id]
    assert th.audio_token_id in ids


def test_composite_loads_without_missing_keys(omni_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model, info = Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        str(omni_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert model.has_talker


def test_load_code2wav_weights_equal_saved(omni_dir, c2w):
    saved = {k.removeprefix("code2wav."): v for k, v in _saved(omni_dir).items()
             if k.startswith("code2wav.")}
    state = c2w.module.state_dict()
    assert set(state) == set(saved)
    for k, v in saved.items():
        assert torch.equal(state[k].to(v.dtype), v), k  # bf16 -> f32 is exact
    assert c2w.random_weights and c2w.dtype == torch.float32


def test_naive_from_pretrained_leaves_random_weights(omni_dir):
    """The pitfall our loader exists for: the combined dir's code2wav.* keys do not load."""
    from transformers import AutoConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    cfg = AutoConfig.from_pretrained(str(omni_dir)).code2wav_config
    naive, info = Qwen3OmniMoeCode2Wav.from_pretrained(str(omni_dir), config=cfg,
                                                        output_loading_info=True)
    assert info["missing_keys"] and info["unexpected_keys"]  # no exception, only a report
    saved = _saved(omni_dir)
    w = naive.state_dict()["code_embedding.weight"]
    assert not torch.equal(w.to(torch.bfloat16), saved["code2wav.code_embedding.weight"])


def test_load_code2wav_is_strict(omni_dir, tmp_path):
    import shutil

    from safetensors.torch import save_file

    bad = tmp_path / "bad"
    shutil.copytree(omni_dir, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    key = "code2wav.code_embedding.weight"
    shard = bad / index["weight_map"][key]
    tensors = load_file(str(shard))
    del tensors[key]
    save_file(tensors, str(shard), metadata={"format": "pt"})
    del index["weight_map"][key]
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(EngineLoadError, match="code_embedding"):
        load_code2wav(str(bad))


def test_code2wav_properties_and_decode(c2w):
    assert (c2w.num_quantizers, c2w.codebook_size) == (4, 64)
    assert c2w.samples_per_frame == 8 * 5 * 4 * 3 * 2 * 2 == 1920
    assert c2w.sample_rate == SAMPLE_RATE == 24000
    # 1 sliding layer (window 72 -> 71 earlier frames) + 10 frames of conv stack
    assert c2w.receptive_field_frames == 81
    # each trans-conv looks one step ahead: 8*5*4*3 + 5*4*3 + 4*3 + 3
    assert c2w.tail_samples == 555
    codes = torch.randint(0, 64, (2, 4, 12), generator=torch.Generator().manual_seed(0))
    wav = c2w.decode(codes)
    assert wav.dtype == torch.float32 and wav.shape == (2, 12 * 1920 - 555)
    assert wav.shape[1] == c2w.output_samples(12)
    assert float(wav.abs().max()) <= 1.0
    with pytest.raises(ValueError):
        c2w.decode(codes[:, :3])


def test_receptive_field_is_exact_left_context(c2w):
    """A chunk decoded with receptive_field_frames of context equals the one-shot samples,
    the tail of its last context frame (which the chunk before could not make) included."""
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 64, (1, 4, 110), generator=g)
    full = c2w.decode(codes)[0]
    scale = float(full.abs().max())
    s, e, spf = 95, 110, c2w.samples_per_frame
    errs = {}
    for ctx in (0, 25, c2w.receptive_field_frames):
        chunk = c2w.decode_chunk(codes[..., s - ctx:e], ctx)[0]
        start = s * spf - (c2w.tail_samples if ctx else 0)
        assert start + chunk.shape[0] == full.shape[0]  # it runs to the one-shot end
        errs[ctx] = float((chunk - full[start:start + chunk.shape[0]]).abs().max()) / scale
    print(f"relative max |chunk - one-shot| by left context: {errs} (scale {scale:.3g})")
    assert errs[c2w.receptive_field_frames] < 1e-5
    assert errs[0] > 1e-3  # context matters: without it the chunk differs


def test_runner_parse_rejects_bad_codes(c2w):
    r = Code2WavRunner(c2w, {"chunk_frames": 4})
    assert r.parse([[1, 2]] * 4).shape == (4, 2)
    for bad in ([[1, 2]] * 3, [[1, 64]] * 4, [[1, -1]] * 4, [[1, 2.0]] * 4, [[1, 2], [1]] * 2,
                "abcd", [[True, 1]] * 4):
        with pytest.raises(ValueError):
            r.parse(bad)
