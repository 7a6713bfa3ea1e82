"""The release shapes of `python -m bench vlm --shape release` (omni/fixtures/vl_release.py)
are the releases': each model, built on the meta device (no memory, no init), has the
parameter count its model card gives, so a typo in a number fails here rather than as a
wrong measurement on the GPU box (the 8 B models are built there only)."""

from __future__ import annotations

import pytest
import torch

from omni.fixtures import vl_release

torch.set_num_threads(1)

# the model cards' counts: Qwen2.5-VL-7B-Instruct 8.29 B, Qwen3-VL-8B-Instruct 8.77 B,
# whisper-large-v3 1.55 B
EXPECTED = {"qwen2_5_vl": 8.29e9, "qwen3_vl": 8.77e9, "whisper_hf": 1.55e9}


@pytest.mark.parametrize("family", vl_release.FAMILIES)
def test_the_release_shape_has_the_releases_parameter_count(family, tmp_path):
    count = vl_release.meta_parameters(family, tmp_path)
    assert count == pytest.approx(EXPECTED[family], rel=0.01)


@pytest.mark.parametrize("family", vl_release.FAMILIES)
def test_layers_cut_the_text_model_only_and_keep_the_fixture_ids(family, tmp_path):
    tok = vl_release.tokenizer(family, tmp_path)
    config = vl_release.CONFIGS[family](tok, 2)
    if family == "whisper_hf":
        assert (config.encoder_layers, config.decoder_layers, config.d_model) == (2, 2, 1280)
        assert config.decoder_start_token_id < len(tok) <= config.vocab_size == 51866
        return
    text, vision = config.text_config, config.vision_config
    assert text.num_hidden_layers == 2
    assert vision.depth == {"qwen2_5_vl": 32, "qwen3_vl": 27}[family]  # the tower stays whole
    assert vision.out_hidden_size == text.hidden_size
    # the fixture tokenizer's special ids, inside the release's vocabulary
    assert config.image_token_id < len(tok) <= text.vocab_size
    assert vl_release.builder_name(family, 2) != vl_release.builder_name(family, None)
