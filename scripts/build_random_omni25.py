#!/usr/bin/env python
"""Build a Qwen2.5-Omni directory with Qwen2.5-Omni-7B's shapes and random weights, for speed.

The layout is the tiny fixture's (omni/fixtures/tiny_omni25.py: one combined checkpoint,
tokenizer, chat template, feature extractor, spk_dict.pt), with the models at the sizes of
Qwen2.5-Omni-7B:

  thinker    Qwen2.5-7B: hidden 3584, 28 layers, 28 heads / 4 KV heads, MLP 18944,
             vocabulary 152064 (--thinker-layers keeps fewer)
  talker     hidden 896, 24 layers, 12 heads / 4 KV heads of 128, MLP 4864, input width
             3584 (the thinker's), codec vocabulary 8448
  token2wav  transformers' defaults, which are the release's: DiT hidden 1024, 22 layers,
             block 24, mel 80; BigVGAN 1536 channels, x240 upsampling (24 kHz)

One change from the release: the DiT's codec table covers the whole talker vocabulary
(8448, not 8193), since a random talker samples every id. The audio and vision encoders
stay tiny (text prompts never run them). The tokenizer is the tiny BPE widened with filler
tokens to 151643 entries, so the specials sit where the release has them (<|AUDIO|> 151646,
<|IMAGE|> 151655) and the tts markers at 151859..151861.

Weights: the composite model is built on the meta device and each tensor `save_pretrained`
would write is drawn (randn * 0.02, norms 1) and streamed to safetensors shards.

    python scripts/build_random_omni25.py --out /data/omni25 --thinker-layers 28
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

try:
    from omni.fixtures import release_files, tiny_omni25
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni.fixtures import release_files, tiny_omni25
sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_random_model as brm  # noqa: E402  (the shard writer and the filler tokens)
import build_random_omni as bro  # noqa: E402  (the tiny-fixture name check)

ROPE = dict(rope_type="default", rope_theta=1e6, mrope_section=[16, 24, 24])
THINKER = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
               num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               max_position_embeddings=32768, rope_parameters=ROPE)
TALKER = dict(vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=4864,
              num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4, head_dim=128,
              max_position_embeddings=32768, rope_parameters=ROPE,
              tts_codec_pad_token_id=8292, tts_codec_start_token_id=8293,
              tts_codec_end_token_id=8294, tts_codec_mask_token_id=8296,
              tts_text_pad_token_id=151859, tts_text_start_token_id=151860,
              tts_text_end_token_id=151861)


def write_tokenizer(out: Path) -> Any:
    vocab, merges = release_files._train_bpe(special_gap="")
    i = 0
    while len(vocab) < brm.FIRST_SPECIAL:
        token = brm._filler(i)
        i += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    return release_files.qwen_tokenizer_with_specials(
        out, vocab, merges, tiny_omni25.OMNI25_SPECIAL_TOKENS,
        tiny_omni25.OMNI25_CHAT_TEMPLATE, 32768)


def configs(tok: Any, thinker_layers: int) -> dict[str, Any]:
    kwargs = tiny_omni25.omni25_configs(tok)
    thinker = kwargs["thinker_config"]
    thinker["text_config"].update(THINKER, num_hidden_layers=thinker_layers)
    thinker["audio_config"]["output_dim"] = THINKER["hidden_size"]
    thinker["vision_config"]["out_hidden_size"] = THINKER["hidden_size"]
    kwargs["talker_config"].update(TALKER)
    kwargs["token2wav_config"] = dict(dit_config=dict(num_embeds=TALKER["vocab_size"]),
                                      bigvgan_config={})
    return kwargs


def disk_tensors(config: Any, dtype: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of what save_pretrained writes for the composite (meta device)."""
    import torch
    from transformers import Qwen2_5OmniForConditionalGeneration
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    with torch.device("meta"):
        model = Qwen2_5OmniForConditionalGeneration(config).to(dtype)
    # the on-disk names (save_pretrained reverts the in-memory renames, e.g.
    # thinker.model.audio_tower -> thinker.audio_tower)
    state = revert_weight_conversion(model, remove_tied_weights_from_state_dict(
        model.state_dict(), model))
    return {name: tuple(t.shape) for name, t in state.items()}


def build(out: Path, thinker_layers: int, seed: int, device: str, shard_gb: float) -> Path:
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniConfig

    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out)
    config = Qwen2_5OmniConfig(**configs(tok, thinker_layers))
    config.torch_dtype = "bfloat16"
    config.save_pretrained(str(out))
    eot, im_end = tok.convert_tokens_to_ids([release_files.ENDOFTEXT, release_files.IM_END])
    GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                     do_sample=True, temperature=0.7, top_k=20,
                     top_p=0.8).save_pretrained(str(out))
    tiny_omni25._write_processor(out)
    tiny_omni25._write_speakers(out, config, TALKER["tts_text_end_token_id"] + 1)
    tensors = disk_tensors(config, torch.bfloat16)
    bro.check_against_tiny(tensors, "qwen2_5_omni")
    brm.write_tensors(out, tensors, "bfloat16", int(shard_gb * 1e9), seed, device)
    marker = {"random_weights": True, "builder": f"build_random_omni25:{thinker_layers}",
              "version": release_files.FIXTURE_VERSION, "seed": seed}
    (out / release_files.FIXTURE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="directory to write")
    parser.add_argument("--thinker-layers", type=int, default=28,
                        help="thinker decoder layers (release: 28; per-layer shapes stay)")
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
    brm.say(f"[build] Qwen2.5-Omni shapes -> {args.out} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
