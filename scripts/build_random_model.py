#!/usr/bin/env python
"""Build a real-size Qwen3 / Qwen3-MoE checkpoint with random weights, for speed benchmarks.

The directory has the Hugging Face release layout: config.json with the published shapes
of the named release, generation_config.json, safetensors shards with
model.safetensors.index.json (the tensor names `save_pretrained` writes for the
architecture), tokenizer files, chat template, and omni_fixture.json saying the weights
are random. Output text is meaningless; speed is what it is for (use ignore_eos and fixed
lengths).

The tokenizer is the tiny fixture's byte-level BPE (trained offline, omni.fixtures)
widened to the real vocabulary: ids past its learned entries are filler tokens (" xab",
...) so every id a random model samples decodes to some text, as with a real vocabulary;
<|endoftext|>, <|im_start|>, <|im_end|> sit at 151643-151645 as in the release, and the
config's vocab_size is the release's 151936.

Weights are written tensor by tensor (model built on the "meta" device, each tensor drawn
with randn * 0.02, norm weights 1), so memory holds one tensor at a time, not the model.

    python scripts/build_random_model.py --shape qwen3-8b --out /data/qwen3-8b-random
    python scripts/build_random_model.py --shape qwen3-30b-a3b --out /data/q30 --device cuda
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

try:
    from omni.fixtures import release_files
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni.fixtures import release_files

VOCAB_SIZE = 151936  # the releases' embedding rows (past the tokenizer, padded)
FIRST_SPECIAL = 151643  # <|endoftext|>; <|im_start|> and <|im_end|> follow
COMMON: dict[str, Any] = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": FIRST_SPECIAL,
    "eos_token_id": FIRST_SPECIAL + 2, "head_dim": 128, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "use_cache": True,
    "use_sliding_window": False, "vocab_size": VOCAB_SIZE,
}
DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
       "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
       "output_router_logits": False, "router_aux_loss_coef": 0.001}
# The published config.json values of each release (Qwen/Qwen3-1.7B, -8B, -30B-A3B);
# tiny and tiny-moe keep the real vocabulary with a toy body, for tests.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": {**DENSE, "hidden_size": 2048, "intermediate_size": 6144,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "max_window_layers": 28, "tie_word_embeddings": True},
    "qwen3-8b": {**DENSE, "hidden_size": 4096, "intermediate_size": 12288,
                 "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "max_window_layers": 36, "tie_word_embeddings": False},
    "qwen3-30b-a3b": {**MOE, "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4,
                      "max_window_layers": 48, "tie_word_embeddings": False},
    "tiny": {**DENSE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "max_window_layers": 2, "tie_word_embeddings": True},
    "tiny-moe": {**MOE, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
                 "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "max_window_layers": 2, "tie_word_embeddings": False},
}
GENERATION_CONFIG = {"bos_token_id": FIRST_SPECIAL, "do_sample": True,
                     "eos_token_id": [FIRST_SPECIAL + 2, FIRST_SPECIAL],
                     "pad_token_id": FIRST_SPECIAL, "temperature": 0.6, "top_k": 20,
                     "top_p": 0.95}
SAFETENSORS_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def say(text: str) -> None:
    print(text, flush=True)


# -- tokenizer ----------------------------------------------------------------------------
def _filler(i: int) -> str:
    """A byte-level token decoding to " x" + letters (unique per i)."""
    letters = ""
    while True:
        i, r = divmod(i, 26)
        letters = chr(97 + r) + letters
        if i == 0:
            return "\u0120x" + letters  # \u0120 (Ġ) is the byte-level space


def write_tokenizer(out: Path) -> None:
    """The tiny fixture's BPE, widened with filler tokens to FIRST_SPECIAL entries."""
    from transformers import Qwen2Tokenizer

    vocab, merges = release_files._train_bpe()
    i = 0
    while len(vocab) < FIRST_SPECIAL:
        token = _filler(i)
        i += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    eot, im_start, im_end = release_files.QWEN_SPECIAL_TOKENS
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token=eot, pad_token=eot, clean_up_tokenization_spaces=False)
    tok.add_special_tokens({"additional_special_tokens": [im_start, im_end]})
    tok.eos_token = im_end  # as the releases: eos <|im_end|>, pad <|endoftext|>
    tok.chat_template = release_files.CHATML_TEMPLATE
    tok.model_max_length = 131072
    tok.save_pretrained(str(out))
    release_files.write_slow_tokenizer_files(out, vocab, merges)
    ids = tok.convert_tokens_to_ids([eot, im_start, im_end])
    if ids != [FIRST_SPECIAL, FIRST_SPECIAL + 1, FIRST_SPECIAL + 2]:
        raise RuntimeError(f"special tokens landed at {ids}, not at {FIRST_SPECIAL}..")


# -- weights ------------------------------------------------------------------------------
def disk_tensors(config: Any, dtype: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor `save_pretrained` writes for this config, in its order
    (tied weights dropped; fused in-memory weights, e.g. MoE experts in transformers 5,
    reverted to their on-disk per-expert form). Built on the meta device: no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    state = model.state_dict()
    try:  # transformers 5: what save_pretrained does before writing
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError:  # 4.x: the state dict is the on-disk form; drop tied copies
        tied = set(getattr(model, "_tied_weights_keys", None) or ())
        state = {k: v for k, v in state.items() if k not in tied}
    else:
        state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(state, model))
    return {name: tuple(t.shape) for name, t in state.items()}


def check_names(raw: dict[str, Any], tensors: dict[str, tuple[int, ...]]) -> None:
    """Raise unless the names match what save_pretrained writes for a tiny model of the same
    config.json (`raw`; layer and expert numbers masked): guards disk_tensors on other
    transformers versions."""
    import re
    import tempfile

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    small = {k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype")}
    small = AutoConfig.for_model(**{
        **small, "bos_token_id": None, "eos_token_id": None, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "max_window_layers": 2, "moe_intermediate_size": 16,
        **({"num_experts": 4, "num_experts_per_tok": 2}
           if raw.get("num_experts") else {})})
    with tempfile.TemporaryDirectory() as tmp:
        AutoModelForCausalLM.from_config(small, dtype=torch.float32).save_pretrained(tmp)
        with safe_open(f"{tmp}/model.safetensors", "pt") as f:
            saved = set(f.keys())

    def masked(names: Any) -> set[str]:
        return {re.sub(r"\.\d+\.", ".N.", n) for n in names}

    if masked(saved) != masked(tensors):
        raise RuntimeError("tensor names differ from save_pretrained's: only ours "
                           f"{sorted(masked(tensors) - masked(saved))[:6]}, only theirs "
                           f"{sorted(masked(saved) - masked(tensors))[:6]}")


def plan_shards(tensors: dict[str, tuple[int, ...]], itemsize: int,
                max_bytes: int) -> list[list[str]]:
    """Greedy, in order: a new shard when the next tensor would pass max_bytes."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in tensors.items():
        n = math.prod(shape) * itemsize
        if shards[-1] and size + n > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def _header(names: list[str], tensors: dict[str, tuple[int, ...]], dtype_name: str,
            itemsize: int) -> bytes:
    meta: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in names:
        n = math.prod(tensors[name]) * itemsize
        meta[name] = {"dtype": SAFETENSORS_DTYPES[dtype_name], "shape": list(tensors[name]),
                      "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(meta, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw


def _random(name: str, shape: tuple[int, ...], dtype: Any, device: str, gen: Any) -> Any:
    import torch

    if len(shape) == 1 and name.endswith("norm.weight"):
        return torch.ones(shape, dtype=dtype)
    t = torch.randn(shape, dtype=torch.float32 if device == "cpu" else dtype, device=device,
                    generator=gen)
    return t.mul_(0.02).to(dtype=dtype, device="cpu")


def write_weights(out: Path, config: Any, raw: dict[str, Any], dtype_name: str,
                  shard_bytes: int, seed: int, device: str) -> int:
    """Write the safetensors shards (+ index when more than one); returns total bytes."""
    import torch

    tensors = disk_tensors(config, getattr(torch, dtype_name))
    check_names(raw, tensors)
    return write_tensors(out, tensors, dtype_name, shard_bytes, seed, device)


def write_tensors(out: Path, tensors: dict[str, tuple[int, ...]], dtype_name: str,
                  shard_bytes: int, seed: int, device: str) -> int:
    """Random values for every named tensor, streamed to shards; returns total bytes."""
    import torch

    dtype = getattr(torch, dtype_name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards = plan_shards(tensors, itemsize, shard_bytes)
    gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(math.prod(s) for s in tensors.values()) * itemsize
    say(f"[build] {len(tensors)} tensors, {sum(math.prod(s) for s in tensors.values()) / 1e9:.3f}"
        f" B parameters, {total / 1e9:.2f} GB in {dtype_name}, {len(shards)} shard(s)")
    weight_map, started = {}, time.perf_counter()
    for i, names in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else \
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        with open(out / file, "wb") as f:
            f.write(_header(names, tensors, dtype_name, itemsize))
            for name in names:
                t = _random(name, tensors[name], dtype, device, gen)
                f.write(memoryview(t.contiguous().view(torch.uint8).numpy()))
                weight_map[name] = file
        say(f"[build] wrote {file} ({len(names)} tensors) at "
            f"{time.perf_counter() - started:.1f} s")
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return total


# -- the directory ------------------------------------------------------------------------
def build(shape: str, out: Path, *, dtype: str = "bfloat16", shard_gb: float = 4.0,
          seed: int = 0, device: str = "cpu", layers: int | None = None) -> Path:
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = {**COMMON, **SHAPES[shape], "torch_dtype": dtype}
    if layers is not None:  # same per-layer shapes, fewer layers (fits a smaller disk)
        config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG, indent=2) + "\n")
    write_tokenizer(out)
    hf_config = AutoConfig.from_pretrained(str(out), local_files_only=True)
    write_weights(out, hf_config, config, dtype, int(shard_gb * 1e9), seed, device)
    marker = {"random_weights": True, "builder": f"build_random_model:{shape}",
              "version": release_files.FIXTURE_VERSION, "seed": seed}
    (out / release_files.FIXTURE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Offline; see the module doc for the layout.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES),
                        help="the release whose config.json shapes to use (tiny, tiny-moe: "
                             "real vocabulary, toy body, for tests)")
    parser.add_argument("--out", required=True, type=Path, help="directory to write")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(SAFETENSORS_DTYPES),
                        help="weights dtype on disk (default bfloat16, as the releases)")
    parser.add_argument("--shard-gb", type=float, default=4.0,
                        help="largest shard in GB (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument("--device", default=None,
                        help="where the random numbers are drawn (default: cuda when "
                             "available, else cpu; cuda is much faster for 8B+)")
    parser.add_argument("--layers", type=int, default=None,
                        help="keep only this many decoder layers (per-layer shapes, so a "
                             "decode step's cost per layer, stay the release's)")
    parser.add_argument("--force", action="store_true",
                        help="replace OUT if it already holds a model")
    args = parser.parse_args(argv)
    if (args.out / "config.json").exists():
        if not args.force:
            parser.error(f"{args.out} already holds a model; pass --force to replace it")
        shutil.rmtree(args.out)
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    build(args.shape, args.out, dtype=args.dtype, shard_gb=args.shard_gb, seed=args.seed,
          device=device, layers=args.layers)
    say(f"[build] {args.shape} -> {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
