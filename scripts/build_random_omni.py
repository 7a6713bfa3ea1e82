#!/usr/bin/env python
"""Build an omni model directory with a release's real shapes and random weights, for speed.

--family qwen3_omni (the default): Qwen3-Omni-MoE at the sizes of Qwen3-Omni-30B-A3B, the
layout of the tiny fixture omni/fixtures/tiny_omni.py (one combined checkpoint, tokenizer,
chat template, feature extractor):

  thinker   hidden 2048, 32 heads / 4 KV heads of 128, 128 experts (8 routed) of 768,
            vocabulary 152064; 48 layers in the release (--thinker-layers keeps fewer)
  talker    hidden 1024, 16 heads / 2 KV heads of 128, 128 experts (8 routed) of 384 and
            a shared expert of 768, 20 layers, codec vocabulary 3072; code predictor
            hidden 1024, 5 layers, 16 code groups of 2048 codes
  code2wav  hidden 1024, 8 layers, decoder_dim 1536, 16 quantizers, 24 kHz (1920 samples
            per frame)

Where models.md does not give a number, transformers' own config defaults are used (the
talker's experts per token, the code predictor's and code2wav's layer sizes).

--family qwen2_5_omni: Qwen2.5-Omni at the sizes of Qwen2.5-Omni-7B, the layout of
omni/fixtures/tiny_omni25.py (the same, plus spk_dict.pt):

  thinker    Qwen2.5-7B: hidden 3584, 28 layers, 28 heads / 4 KV heads, MLP 18944,
             vocabulary 152064 (--thinker-layers keeps fewer)
  talker     hidden 896, 24 layers, 12 heads / 4 KV heads of 128, MLP 4864, input width
             3584 (the thinker's), codec vocabulary 8448
  token2wav  transformers' defaults, which are the release's: DiT hidden 1024, 22 layers,
             block 24, mel 80; BigVGAN 1536 channels, x240 upsampling (24 kHz)

One change from that release: the DiT's codec table covers the whole talker vocabulary
(8448, not 8193), since a random talker samples every id.

Both: the audio and vision encoders stay tiny (text prompts never run them). The tokenizer
is the tiny BPE widened with filler tokens to 151643 entries, so the specials sit where the
release has them (<|AUDIO|> 151646, <|IMAGE|> 151655; Qwen2.5-Omni's tts markers at
151859..151861) and every id a random thinker samples decodes to text.

Weights: the composite model is built on the meta device and each tensor `save_pretrained`
would write is drawn (randn * 0.02, norms 1) and streamed to safetensors shards, so
memory holds one tensor at a time.

    python scripts/build_random_omni.py --out /data/omni --thinker-layers 24
    python scripts/build_random_omni.py --family qwen2_5_omni --out /data/omni25
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from omni.fixtures import release_files, tiny_models, tiny_omni, tiny_omni25
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from omni.fixtures import release_files, tiny_models, tiny_omni, tiny_omni25
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

ROPE25 = dict(rope_type="default", rope_theta=1e6, mrope_section=[16, 24, 24])
THINKER25 = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                 num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                 max_position_embeddings=32768, rope_parameters=ROPE25)
TALKER25 = dict(vocab_size=8448, embedding_size=3584, hidden_size=896, intermediate_size=4864,
                num_hidden_layers=24, num_attention_heads=12, num_key_value_heads=4,
                head_dim=128, max_position_embeddings=32768, rope_parameters=ROPE25,
                tts_codec_pad_token_id=8292, tts_codec_start_token_id=8293,
                tts_codec_end_token_id=8294, tts_codec_mask_token_id=8296,
                tts_text_pad_token_id=151859, tts_text_start_token_id=151860,
                tts_text_end_token_id=151861)


def write_tokenizer(out: Path, family: str = "qwen3_omni") -> Any:
    fam = FAMILIES[family]
    vocab, merges = release_files._train_bpe(special_gap="")
    i = 0
    while len(vocab) < brm.FIRST_SPECIAL:
        token = brm._filler(i)
        i += 1
        if token not in vocab:
            vocab[token] = len(vocab)
    return release_files.qwen_tokenizer_with_specials(
        out, vocab, merges, fam.special_tokens, fam.chat_template, fam.max_length)


def configs(tok: Any, thinker_layers: int, family: str = "qwen3_omni") -> dict[str, Any]:
    """The composite config's keyword arguments: the tiny fixture's, at the release's sizes."""
    kwargs = FAMILIES[family].tiny_configs(tok)
    thinker = kwargs["thinker_config"]
    width = FAMILIES[family].thinker_width
    thinker["audio_config"]["output_dim"] = width
    thinker["vision_config"]["out_hidden_size"] = width
    FAMILIES[family].resize(kwargs, thinker_layers)
    return kwargs


def _qwen3_sizes(kwargs: dict[str, Any], thinker_layers: int) -> None:
    thinker, talker = kwargs["thinker_config"], kwargs["talker_config"]
    thinker["text_config"].update(THINKER, num_hidden_layers=thinker_layers)
    cb = CODEBOOK
    talker["text_config"].update(TALKER)
    talker["code_predictor_config"].update(PREDICTOR)
    talker.update(num_code_groups=QUANTIZERS, thinker_hidden_size=THINKER["hidden_size"],
                  accept_hidden_layer=min(18, thinker_layers), speaker_id={"ethan": cb + 6},
                  codec_pad_id=cb, codec_bos_id=cb + 1, codec_eos_token_id=cb + 2,
                  codec_nothink_id=cb + 3, codec_think_bos_id=cb + 4, codec_think_eos_id=cb + 5)
    kwargs["code2wav_config"] = dict(CODE2WAV)


def _qwen25_sizes(kwargs: dict[str, Any], thinker_layers: int) -> None:
    kwargs["thinker_config"]["text_config"].update(THINKER25, num_hidden_layers=thinker_layers)
    kwargs["talker_config"].update(TALKER25)
    kwargs["token2wav_config"] = dict(dit_config=dict(num_embeds=TALKER25["vocab_size"]),
                                      bigvgan_config={})


def _qwen3_files(out: Path, config: Any) -> None:
    tiny_omni._write_processor(out)


def _qwen25_files(out: Path, config: Any) -> None:
    tiny_omni25._write_processor(out)
    tiny_omni25._write_speakers(out, config, TALKER25["tts_text_end_token_id"] + 1)


@dataclass(frozen=True)
class Family:
    """What differs between the omni families this script builds."""
    title: str
    fixture: str  # the tiny fixture of the same class (its tensor names are checked)
    config_class: str  # transformers' composite config and model classes
    model_class: str
    release_layers: int  # the release's thinker layers
    thinker_width: int
    special_tokens: Any
    chat_template: str
    max_length: int
    tiny_configs: Callable[[Any], dict[str, Any]]
    resize: Callable[[dict[str, Any], int], None]
    files: Callable[[Path, Any], None]  # what else the release ships (processor, speakers)
    marker: str  # the fixture marker's builder name (kept from before the merge)


FAMILIES = {
    "qwen3_omni": Family(
        "Qwen3-Omni", "qwen3_omni", "Qwen3OmniMoeConfig",
        "Qwen3OmniMoeForConditionalGeneration", THINKER["num_hidden_layers"],
        THINKER["hidden_size"], tiny_omni.OMNI_SPECIAL_TOKENS, tiny_omni.OMNI_CHAT_TEMPLATE,
        131072, tiny_omni.omni_configs, _qwen3_sizes, _qwen3_files, "build_random_omni"),
    "qwen2_5_omni": Family(
        "Qwen2.5-Omni", "qwen2_5_omni", "Qwen2_5OmniConfig",
        "Qwen2_5OmniForConditionalGeneration", THINKER25["num_hidden_layers"],
        THINKER25["hidden_size"], tiny_omni25.OMNI25_SPECIAL_TOKENS,
        tiny_omni25.OMNI25_CHAT_TEMPLATE, 32768, tiny_omni25.omni25_configs, _qwen25_sizes,
        _qwen25_files, "build_random_omni25"),
}


def disk_tensors(config: Any, dtype: Any,
                 family: str = "qwen3_omni") -> dict[str, tuple[int, ...]]:
    """Name -> shape of what save_pretrained writes for the composite (meta device)."""
    import torch
    import transformers
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    with torch.device("meta"):
        model = getattr(transformers, FAMILIES[family].model_class)(config).to(dtype)
    # the on-disk names (save_pretrained reverts the in-memory renames, e.g.
    # thinker.model.audio_tower -> thinker.audio_tower)
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


def build(out: Path, thinker_layers: int, seed: int, device: str, shard_gb: float,
          family: str = "qwen3_omni") -> Path:
    import torch
    import transformers
    from transformers import GenerationConfig

    fam = FAMILIES[family]
    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out, family)
    config = getattr(transformers, fam.config_class)(**configs(tok, thinker_layers, family))
    config.torch_dtype = "bfloat16"
    config.save_pretrained(str(out))
    eot, im_end = tok.convert_tokens_to_ids([release_files.ENDOFTEXT, release_files.IM_END])
    GenerationConfig(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot,
                     do_sample=True, temperature=0.7, top_k=20,
                     top_p=0.8).save_pretrained(str(out))
    fam.files(out, config)
    tensors = disk_tensors(config, torch.bfloat16, family)
    check_against_tiny(tensors, fam.fixture)
    brm.write_tensors(out, tensors, "bfloat16", int(shard_gb * 1e9), seed, device)
    marker = {"random_weights": True, "builder": f"{fam.marker}:{thinker_layers}",
              "version": release_files.FIXTURE_VERSION, "seed": seed}
    (out / release_files.FIXTURE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=tuple(FAMILIES), default="qwen3_omni",
                        help="which release's shapes (default qwen3_omni)")
    parser.add_argument("--out", required=True, type=Path, help="directory to write")
    parser.add_argument("--thinker-layers", type=int, default=None,
                        help="thinker decoder layers (default the release's: 48 for "
                             "qwen3_omni, 28 for qwen2_5_omni; per-layer shapes stay)")
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
    fam = FAMILIES[args.family]
    started = time.perf_counter()
    build(args.out, args.thinker_layers or fam.release_layers, args.seed, device,
          args.shard_gb, args.family)
    brm.say(f"[build] {fam.title} shapes -> {args.out} in "
            f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
