"""Tiny fixture model directories: release layout, tokenizer, weights, cache builds."""

from __future__ import annotations

import json
import re
import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from omni.engines.base import EngineLoadError
from omni.fixtures import (
    FIXTURE_MARKER,
    FIXTURE_VERSION,
    TINY_MODELS,
    build_tiny_qwen3,
    build_tiny_qwen3_moe,
    ensure_tiny_model,
)
from omni.models.hf_causal import apply_chat_template, load_causal_lm

torch.set_num_threads(1)

COMMON_FILES = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "vocab.json", "merges.txt", "chat_template.jinja", FIXTURE_MARKER]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {"qwen3": build_tiny_qwen3(root / "qwen3"),
            "qwen3_moe": build_tiny_qwen3_moe(root / "qwen3_moe")}


def _saved_tensors(d) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_release_files(dirs):
    q, m = dirs["qwen3"], dirs["qwen3_moe"]
    for d in (q, m):
        for name in COMMON_FILES:
            assert (d / name).is_file(), f"{d.name} lacks {name}"
    assert (q / "model.safetensors").is_file()
    assert not (q / "model.safetensors.index.json").exists()
    assert not (m / "model.safetensors").exists()
    shards = sorted(p.name for p in m.glob("model-*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((m / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert set(index["weight_map"]) == set(_saved_tensors(m))
    # the MoE checkpoint is in the released per-expert layout
    assert any(re.search(r"experts\.3\.gate_proj\.weight$", k) for k in index["weight_map"])
    marker = json.loads((q / FIXTURE_MARKER).read_text())
    assert marker["random_weights"] is True and marker["builder"] == "qwen3"
    assert marker["version"] == FIXTURE_VERSION


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_tokenizer_and_special_ids(dirs, name):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    d = dirs[name]
    tok = AutoTokenizer.from_pretrained(str(d))
    cfg = AutoConfig.from_pretrained(str(d))
    gen = GenerationConfig.from_pretrained(str(d))
    assert 900 <= len(tok) <= cfg.vocab_size
    for text in ["Hello world, this is a tiny test!", "café naïve 日本語 🙂 12345\n\ttabs",
                 "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok.decode(tok.encode(text)) == text
    eot, im_start, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert tok.encode("<|im_start|>x<|im_end|>")[0] == im_start  # one token each
    assert cfg.bos_token_id == eot and cfg.eos_token_id == im_end
    assert gen.bos_token_id == eot and gen.pad_token_id == eot
    assert set(gen.eos_token_id) == {im_end, eot}
    assert tok.eos_token_id == im_end and tok.pad_token_id == eot
    vocab = json.loads((d / "vocab.json").read_text())
    assert len(vocab) == eot  # the specials follow the BPE vocab, like Qwen's
    merges = (d / "merges.txt").read_text().splitlines()
    assert merges[0].startswith("#version") and len(merges) > 500


def test_chat_template(dirs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(dirs["qwen3"]))
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = apply_chat_template(tok, msgs)
    assert ids == tok.encode(text)
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}]
    assert apply_chat_template(tok, parts) == apply_chat_template(tok, msgs[1:])


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_from_pretrained_loads_every_key(dirs, name):
    from transformers import AutoModelForCausalLM

    _, info = AutoModelForCausalLM.from_pretrained(str(dirs[name]), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]


@pytest.mark.parametrize("name", ["qwen3", "qwen3_moe"])
def test_loaded_weights_equal_saved_tensors(dirs, name):
    lm = load_causal_lm(str(dirs[name]))
    assert lm.random_weights and lm.dtype == torch.float32
    assert lm.eos_token_ids == set(json.loads((dirs[name] / "generation_config.json").read_text())["eos_token_id"])
    params = dict(lm.model.named_parameters(remove_duplicate=False))
    saved = _saved_tensors(dirs[name])
    covered = set()
    for key, t in saved.items():
        t = t.float()
        m = re.match(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", key)
        if m:  # transformers fuses the released per-expert tensors into 3-D params
            base, e, kind = m.group(1), int(m.group(2)), m.group(3)
            if kind == "down":
                pkey, got = f"{base}.down_proj", params[f"{base}.down_proj"][e]
            else:
                pkey = f"{base}.gate_up_proj"
                half = params[pkey].shape[1] // 2
                got = params[pkey][e][:half] if kind == "gate" else params[pkey][e][half:]
        else:
            pkey, got = key, params[key]
        assert torch.equal(got, t), key
        covered.add(pkey)
    uncovered = set(params) - covered
    if lm.config.tie_word_embeddings:
        assert uncovered == {"lm_head.weight"}
        assert torch.equal(params["lm_head.weight"], params["model.embed_tokens.weight"])
    else:
        assert not uncovered


def test_load_errors_name_dir_and_missing_file(dirs, tmp_path):
    src = dirs["qwen3_moe"]
    with pytest.raises(EngineLoadError, match="does not exist"):
        load_causal_lm(str(tmp_path / "nope"))
    d = tmp_path / "noconfig"
    shutil.copytree(src, d)
    (d / "config.json").unlink()
    with pytest.raises(EngineLoadError, match=rf"{re.escape(str(d))}.*config\.json"):
        load_causal_lm(str(d))
    d = tmp_path / "noshard"
    shutil.copytree(src, d)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(EngineLoadError, match="model-00002-of-00002.safetensors"):
        load_causal_lm(str(d))
    d = tmp_path / "noweights"
    shutil.copytree(dirs["qwen3"], d)
    (d / "model.safetensors").unlink()
    with pytest.raises(EngineLoadError, match="no weights"):
        load_causal_lm(str(d))
    d = tmp_path / "partial"  # a tensor missing from the file: never silently random
    shutil.copytree(dirs["qwen3"], d)
    tensors = load_file(str(d / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(EngineLoadError, match="up_proj"):
        load_causal_lm(str(d))
    with pytest.raises(EngineLoadError, match="dtype"):
        load_causal_lm(str(src), dtype="float8")


def test_same_seed_same_weights(dirs, tmp_path):
    again = build_tiny_qwen3(tmp_path / "again")
    other = build_tiny_qwen3(tmp_path / "other", seed=1)
    a, b, c = (_saved_tensors(d) for d in (dirs["qwen3"], again, other))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    for f in ("tokenizer.json", "vocab.json", "merges.txt", "config.json"):
        assert (dirs["qwen3"] / f).read_bytes() == (again / f).read_bytes(), f


def test_ensure_tiny_model_builds_once(tmp_path):
    assert set(TINY_MODELS) == {"qwen3", "qwen3_moe", "qwen3_omni", "vits", "qwen_image",
                                "qwen_image_edit", "wan_t2v", "wan_i2v", "pi0", "cosmos3",
                                "qwen2_5_vl", "qwen3_vl", "whisper_hf", "wan22_t2v", "wan22_i2v",
                                "wan22_ti2v", "ltx_video", "ltx2",
                                "flux1", "flux1_kontext", "flux2",
                                "hunyuan_image", "hunyuan_image_distilled",
                                "hunyuan_video_t2v", "hunyuan_video_i2v", "qwen2_5_omni"}
    messages: list[str] = []
    path = ensure_tiny_model("qwen3", tmp_path, progress=messages.append)
    assert path == tmp_path / "qwen3"
    assert any("building tiny qwen3 (random weights)" in m for m in messages)
    marker = json.loads((path / FIXTURE_MARKER).read_text())
    assert marker["random_weights"] is True and marker["builder"] == "qwen3"
    assert marker["version"] == FIXTURE_VERSION
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    messages.clear()
    assert ensure_tiny_model("qwen3", tmp_path, progress=messages.append) == path
    assert messages == [] and (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == ["qwen3"]  # no temp dirs left behind
    with pytest.raises(ValueError, match="unknown tiny model"):
        ensure_tiny_model("nope", tmp_path)


def test_ensure_tiny_model_env_default_and_stale_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    stale = tmp_path / "qwen3"
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # a partial dir without the marker
    path = ensure_tiny_model("qwen3")
    assert path == stale and (path / FIXTURE_MARKER).is_file()
    assert (path / "model.safetensors").is_file()


def test_ensure_tiny_model_concurrent_builders(tmp_path):
    results, errors = [], []

    def worker():
        try:
            results.append(ensure_tiny_model("qwen3_moe", tmp_path))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and results == [tmp_path / "qwen3_moe"] * 2
    assert [p.name for p in tmp_path.iterdir()] == ["qwen3_moe"]
    load_causal_lm(str(tmp_path / "qwen3_moe"))  # complete and loadable
