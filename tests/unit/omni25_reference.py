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
