"""What the Qwen2.5-Omni tests compare with (tests/unit/test_omni25_*.py,
tests/http/test_omni25_chat.py): transformers' own composite generate on a prompt."""

from __future__ import annotations

import torch


def padded(prompt_ids: list[int]) -> dict[str, torch.Tensor]:
    """The prompt left-padded by one token. transformers 5.24's generate drops an all-ones
    attention mask, and its Qwen2.5-Omni talker adds the codec pad/bos embeddings to its
    last two prompt rows only when it gets a mask: so an unpadded request loses them
    there while a padded batch row keeps them (what the model's forward defines, and what
    the talker stage does). A padded row is the reference that runs the definition."""
    return {"input_ids": torch.tensor([[0] + prompt_ids]),
            "attention_mask": torch.tensor([[0] + [1] * len(prompt_ids)])}


def composite_generate(model, prompt_ids: list[int], *, words: int, frames: int,
                       speaker: str, seed: int = 0, **media) -> tuple[list[int], torch.Tensor]:
    """Greedy thinker and talker, token2wav seeded: (answer ids, waveform). media: the
    processor's tensors for the prompt's audio / images."""
    cfg = model.config.talker_config
    torch.manual_seed(seed)  # token2wav's noise, drawn from the global RNG
    seqs, wav = model.generate(
        **padded(prompt_ids), speaker=speaker, thinker_max_new_tokens=words,
        thinker_do_sample=False, thinker_eos_token_id=None, talker_max_new_tokens=frames,
        talker_do_sample=False, talker_repetition_penalty=1.0,
        talker_eos_token_id=[cfg.tts_codec_pad_token_id, cfg.tts_codec_end_token_id], **media)
    return seqs[0, len(prompt_ids) + 1:].tolist(), wav


def mp4_with_track(seed: int, seconds: float = 3.5, fps: int = 8, width: int = 64,
                   height: int = 48) -> bytes:
    """An H.264 MP4 of random frames (blocks of 8 px, so they survive encoding) with an AAC
    track (a tone and noise, per seed). The tiny fixture's processor samples 6 of its 28
    frames (2 a second, floored to whole temporal patches: 1.71 a second), so its
    seconds per grid (temporal patch / fps 2 = 1.0, the Omni processor's) differs from
    Qwen2.5-VL's sampled-rate one (1.17): 3 temporal patches at rotary times 0, 25, 50;
    heard with its track (87 audio tokens) the layout interleaves over two 2 s chunks."""
    import numpy as np

    from omni.media.video import encode_mp4

    rng = np.random.default_rng(seed)
    blocks = rng.random((int(seconds * fps), height // 8, width // 8, 3))
    pixels = (blocks * 255).astype("uint8").repeat(8, 1).repeat(8, 2)
    t = np.arange(int(seconds * 16000)) / 16000
    tone = 0.3 * np.sin(2 * np.pi * (200 + 100 * seed) * t) + 0.05 * rng.standard_normal(len(t))
    return encode_mp4(pixels, fps, audio=tone.astype(np.float32), audio_rate=16000)


def video_inputs(model_dir: str, video: bytes, track=None) -> tuple[str, dict]:
    """(what <|VIDEO|> becomes, the thinker's video / audio kwargs) for one video, made
    with transformers' own pieces that run without torchvision: its PyAV reader and
    Qwen2VLVideoProcessor's frame sampler at fps 2, the video processors' patchify, the
    Omni processor's own size (its videos_kwargs), second_per_grid (temporal patch / fps)
    and, heard with its track, its replace_video_with_audio_token; frames resized with
    PIL bicubic (vl_reference.py)."""
    import json
    from functools import partial
    from pathlib import Path
    from types import SimpleNamespace

    from transformers import WhisperFeatureExtractor
    from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
        Qwen2_5OmniProcessor,
        _get_feat_extract_output_lengths,
    )
    from unit.vl_reference import _patches, _sampled_frames

    config = json.loads((Path(model_dir) / "preprocessor_config.json").read_text())
    rules = {**config, "fps": 2.0, "min_frames": 4, "max_frames": 768,
             "size": Qwen2_5OmniProcessor.videos_kwargs["size"]}
    frames, _ = _sampled_frames(video, rules, qwen3=False)
    patches, grid = _patches(frames, rules, qwen3=False)
    per_grid = torch.tensor([rules["temporal_patch_size"] / rules["fps"]])
    kwargs = {"pixel_values_videos": patches, "video_grid_thw": grid,
              "video_second_per_grid": per_grid}
    if track is None:
        return "<|VIDEO|>" * int(grid.prod() // 4), kwargs
    fe = WhisperFeatureExtractor.from_pretrained(model_dir)
    feats = fe([track], sampling_rate=16000, return_attention_mask=True, return_tensors="pt")
    count = _get_feat_extract_output_lengths(feats["attention_mask"].sum(-1))
    names = SimpleNamespace(
        audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>",
        video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
        video_processor=SimpleNamespace(merge_size=config["merge_size"]),
        get_chunked_index=partial(Qwen2_5OmniProcessor.get_chunked_index, None))
    text = Qwen2_5OmniProcessor.replace_video_with_audio_token(
        names, {"video_grid_thw": grid, "video_second_per_grid": per_grid.tolist()}, 0,
        {"num_audio_tokens": count}, 0,
        position_id_per_seconds=Qwen2_5OmniProcessor.position_id_per_seconds,
        seconds_per_chunk=Qwen2_5OmniProcessor.seconds_per_chunk)
    kwargs.update(input_features=feats["input_features"], use_audio_in_video=True,
                  feature_attention_mask=feats["attention_mask"])
    return text, kwargs
