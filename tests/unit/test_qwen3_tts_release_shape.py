"""The numbers of Qwen3-TTS-12Hz-1.7B's shapes (omni/fixtures/qwen3_tts_release.py) agree
with each other as qwen-tts's model code needs them to, so that a typo fails here rather
than as a shape error on the GPU box (the model is built there only: a 1.7B model on
CPU takes minutes). Plain dictionaries: no qwen-tts import, no weights."""

from __future__ import annotations

import pytest

from omni.fixtures import qwen3_tts_release as release
from omni.fixtures.tiny_qwen3_tts import speech_tokenizer_config, talker_config


@pytest.mark.parametrize("tts_type", ["custom_voice", "base"])
def test_the_talker_fits_its_own_vocabularies(tts_type):
    talker = talker_config(tts_type, "release")
    assert talker["num_hidden_layers"] == 28 and talker["hidden_size"] == 2048
    rope = talker["rope_scaling"]["mrope_section"]
    assert sum(rope) * 2 == talker["head_dim"]  # the 3-axis rotary halves of a head
    assert talker["num_attention_heads"] % talker["num_key_value_heads"] == 0
    # qwen-tts samples with the top 1024 ids suppressed (end-of-speech aside): every
    # special, language and speaker id sits there, above the 2048 codes of a codebook
    top = range(talker["vocab_size"] - 1024, talker["vocab_size"])
    special = [v for k, v in talker.items() if k.startswith("codec_") and isinstance(v, int)]
    ids = special + list(talker["codec_language_id"].values()) + list(talker["spk_id"].values())
    assert all(i in top for i in ids) and len(set(ids)) == len(ids)
    predictor = talker["code_predictor_config"]
    assert predictor["vocab_size"] <= top.start
    assert predictor["num_code_groups"] == talker["num_code_groups"] == 16
    assert (talker["spk_id"] != {}) == (tts_type == "custom_voice")
    dialects = {d for d in talker["spk_is_dialect"].values() if d}
    assert dialects <= set(talker["codec_language_id"])


def test_the_codec_decodes_the_talkers_frames():
    decoder = speech_tokenizer_config("release")["decoder_config"]
    talker = talker_config("custom_voice", "release")
    assert decoder["num_quantizers"] == talker["num_code_groups"]
    assert decoder["codebook_size"] == talker["code_predictor_config"]["vocab_size"]
    samples = 1
    for rate in decoder["upsample_rates"] + decoder["upsampling_ratios"]:
        samples *= rate
    assert samples == speech_tokenizer_config("release")["decode_upsample_rate"] == 1920
    # the speaker encoder's embedding is one of the talker's input embeddings
    assert release.speaker_encoder_config()["enc_dim"] == talker["hidden_size"]
