#!/usr/bin/env python
"""Build a Qwen3-Omni-MoE directory with real-size shapes and random weights, for speed.

The layout is the tiny fixture's (omni/fixtures/tiny_omni.py: one combined checkpoint,
tokenizer, chat template, feature extractor), with the language models at the sizes of
Qwen3-Omni-30B-A3B:

  thinker   hidden 2048, 32 heads / 4 KV heads of 128, 128 experts (8 routed) of 768,
            vocabulary 152064; 48 layers in the release (--thinker-layers keeps fewer)
  talker    hidden 1024, 16 heads / 2 KV heads of 128, 128 experts (8 routed) of 384 and
            a shared expert of 768, 20 layers, codec vocabulary 3072; code predictor
            hidden 1024, 5 layers, 16 code groups of 2048 codes
  code2wav  hidden 1024, 8 layers, decoder_dim 1536, 16 quantizers, 24 kHz (1920 samples
            per frame)

Where models.md does not give a number, transformers' own config defaults are used (the
talker's experts per token, the code predictor's and code2wav's layer sizes); the audio
and vision encoders stay tiny (text prompts never run them). The tokenizer is the tiny
BPE widened with filler tokens to 151643 entries, so the specials sit where the release
has them and every id a random thinker samples decodes to text.

Weights: the composite model is built on the meta device and each tensor `save_pretrained`
would write is drawn (randn * 0.02, norms 1) and streamed to safetensors shards, so
memory holds one tensor at a time.

    python scripts/build_random_omni.py --out /data/omni --thinker-layers 24
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

try:
    from omni.fixtures import release_files, tiny_models, tiny_omni
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni.fixtures import release_files, tiny_models, tiny_omni
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_random_model as brm  # noqa: E402  (the shard writer and the filler tokens)

CODEBOOK, QUANTIZERS = 2048, 16
ROPE = dict(rope_type="default", rope_theta=1e6, mrope_section=[24, 20, 20], interleaved=True)
THINKER = dict(vocab_size=152064, hidden_size=2048, intermediate_size=768,
               num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
               head_dim=128, max_position_embeddings=65536, moe_intermediate_size=768,
               num_experts=128, num_experts_per_tok=8, rope_parameters=ROPE)
TALKER = dict(vocab_size=1024 + CODEBOOK, hidden_size=1024, intermediate_size=2048,
              num_hidden_layers=20, num_attention_heads=16, num_key_value_heads=2, head_dim=128,
              moe_intermediate_size=384, num_experts=128, num_experts_per_tok=8,
              shared_expert_intermediate_size=768, max_position_embeddings=65536,
              rope_parameters=ROPE)
PREDICTOR = dict(vocab_size=CODEBOOK, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=5, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, num_code_groups=QUANTIZERS, max_position_embeddings=256)
CODE2WAV = dict(codebook_size=CODEBOOK, hidden_size=1024, num_attention_heads=16,
                num_key_value_heads=16, num_hidden_layers=8, intermediate_size=3072,
                num_quantizers=QUANTIZERS, decoder_dim=1536, upsample_rates=[8, 5, 4, 3],
                upsampling_ratios=[2, 2], sliding_window=72, max_position_embeddings=8000)


def write_tokenizer(out: Path) -> Any:
    vocab, merges = release_files._train_bpe(special_gap="")
    i = 0
    while len(vocab) < brm.FIRST_SPECIAL:
        token = brm._filler(i)
        i += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    return release_files.qwen_tokenizer_with_specials(
        out, vocab, merges, tiny_omni.OMNI_SPECIAL_TOKENS, tiny_omni.OMNI_CHAT_TEMPLATE, 131072)


def configs(tok: Any, thinker_layers: int) -> dict[str, Any]:
    kwargs = tiny_omni.omni_configs(tok)
    thinker, talker = kwargs["thinker_config"], kwargs["talker_config"]
    thinker["text_config"].update(THINKER, num_hidden_layers=thinker_layers)
    thinker["audio_config"]["output_dim"] = THINKER["hidden_size"]
    thinker["vision_config"]["out_hidden_size"] = THINKER["hidden_size"]
    cb = CODEBOOK
    talker["text_config"].update(TALKER)
    talker["code_predictor_config"].update(PREDICTOR)
    talker.update(num_code_groups=QUANTIZERS, thinker_hidden_size=THINKER["hidden_size"],
                  accept_hidden_layer=min(18, thinker_layers), speaker_id={"ethan": cb + 6},
                  codec_pad_id=cb, codec_bos_id=cb + 1, codec_eos_token_id=cb + 2,
                  codec_nothink_id=cb + 3, codec_think_bos_id=cb + 4, codec_think_eos_id=cb + 5)
    kwargs["code2wav_config"] = dict(CODE2WAV)
    return kwargs


def disk_tensors(config: Any, dtype: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of what save_pretrained writes for the composite (meta device)."""
    import torch
    from transformers import Qwen3OmniMoeForConditionalGeneration
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    with torch.device("meta"):
        model = Qwen3OmniMoeForConditionalGeneration(config).to(dtype)
    state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(
        model.state_dict(), model))
    return {name: tuple(t.shape) for name, t in state.items()}


def check_against_tiny(tensors: dict[str, tuple[int, ...]], name: str = "qwen3_omni") -> None:
    """The names must be those of the tiny fixture `name` (a real save_pretrained of the
    same class), layer and expert numbers masked."""
    from safetensors import safe_open

    tiny = tiny_models.ensure_tiny_model(name)
    saved: set[str] = set()
    for file in tiny.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            saved |= set(f.keys())

    def masked(names: Any) -> set[str]:
        return {re.sub(r"\.\d+\.", ".N.", n) for n in names}

    if masked(saved) != masked(tensors):
        raise RuntimeError(f"tensor names differ from save_pretrained's: only ours "
                           f"{sorted(masked(tensors) - masked(saved))[:6]}, only theirs "
                           f"{sorted(masked(saved) - masked(tensors))[:6]}")


def build(out: Path, thinker_layers: int, seed: int, device: str, shard_gb: float) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out)
    config = Qwen3OmniMoeConfig(**configs(tok, thinker_layers))
    config.torch_dtype = "bfloat16"
    config.save_pretrained(str(out))
    eot, im_end = tok.convert_tokens_to_ids([release_files.ENDOFTEXT, release_files.IM_END])
    GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                     do_sample=True, temperature=0.7, top_k=20,
                     top_p=0.8).save_pretrained(str(out))
    tiny_omni._write_processor(out)
    tensors = disk_tensors(config, torch.bfloat16)
    check_against_tiny(tensors)
    brm.write_tensors(out, tensors, "bfloat16", int(shard_gb * 1e9), seed, device)
    marker = {"random_weights": True, "builder": f"build_random_omni:{thinker_layers}",
              "version": release_files.FIXTURE_VERSION, "seed": seed}
    (out / release_files.FIXTURE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="directory to write")
    parser.add_argument("--thinker-layers", type=int, default=48,
                        help="thinker decoder layers (release: 48; per-layer shapes stay)")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument("--shard-gb", type=float, default=4.0, help="largest shard in GB")
    parser.add_argument("--device", default=None,
                        help="where random numbers are drawn (default cuda when available)")
    args = parser.parse_args(argv)
    if (args.out / "config.json").exists():
        parser.error(f"{args.out} already holds a model")
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    build(args.out, args.thinker_layers, args.seed, device, args.shard_gb)
    brm.say(f"[build] Qwen3-Omni shapes -> {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
