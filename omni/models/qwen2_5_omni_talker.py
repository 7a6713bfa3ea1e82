"""Qwen2.5-Omni's talker as a feedback AR stage (omni/engines/ar/feedback.py) fed by the
thinker's stream.

What the model defines (transformers' ``Qwen2_5OmniForConditionalGeneration.generate``
and ``Qwen2_5OmniTalkerForConditionalGeneration.forward``), per request and per chunk:
- The thinker exports, for every position it fed, its embedding (layer 0) and its last
  layer's hidden state (omni/models/qwen2_5_omni_thinker.py). A position's talker row is
  their sum; media positions (audio, image, video pads) take the hidden state alone.
- Prefill: every thinker prompt row; the speaker's text-bos embedding (a thinker
  embedding row, from spk_dict.pt) over codec_pad; the row of answer token 0 over
  codec_bos. Rows are in the thinker's width; ``thinker_to_talker_proj`` maps each to the
  talker's (done here, once per row: the engine feeds talker-width embeddings).
- Decode step g: the codec embedding of the code just sampled + the row of answer token
  g+1; after the fed answer tokens, the text-eos embedding once, then text-pad forever.
  The thinker's last token is never fed back, so it has no row: an answer of n tokens
  gives n-1 rows. A step whose row has not arrived waits (the engine holds it).
- One codec stream: the code is the token sampled from ``codec_head`` (codec_bos
  suppressed); the stop ids are codec_pad and codec_end (generate's
  ``talker_eos_token_id`` [8292, 8294] are those two ids of the release config).
- Positions: the talker prompt is as long as the thinker prompt + 2; text-only and audio
  prompts take 0, 1, 2, ...; an image prompt takes the thinker's 3-axis positions and
  then continues past their largest (what the model's get_rope_index gives).

Each frame leaves as {"codes": [[code], [speaker]]}: the second row names the speaker
(its index in the release's speaker table), because token2wav conditions on the same
speaker the talker spoke as and only the talker stage is told the voice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, PromptLayout
from omni.models.causal_lm import CausalLM, _is_random, _resolve_dtype, cache_keyword
from omni.models.checkpoint_parts import prefixed_tensors
from omni.models.qwen3_omni_vision import TextFirstRope
from omni.models.spoken_tokens import SpokenTokens, token_text

TALKER_PREFIX = "talker."
SPEAKERS_FILE = "spk_dict.pt"


def load_speakers(path: Path) -> dict[str, dict[str, Any]]:
    """The release's speakers {name: {bos_token, cond, ref_mel}}, names in file order."""
    file = path / SPEAKERS_FILE
    if not file.is_file():
        raise EngineLoadError(f"model directory {path} has no {SPEAKERS_FILE} (the speakers)")
    try:
        speakers = torch.load(file, weights_only=True, map_location="cpu")
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: unreadable {SPEAKERS_FILE}: {e}") from e
    if not isinstance(speakers, dict) or not speakers:
        raise EngineLoadError(f"model directory {path}: {SPEAKERS_FILE} holds no speakers")
    return speakers


class TalkerLM(torch.nn.Module):
    """The talker as the AR engine calls it: forward(inputs_embeds (talker width),
    position_ids, logits_to_keep) -> codec logits of the kept rows, codec_bos suppressed."""

    def __init__(self, talker: Any) -> None:
        super().__init__()
        self.talker = talker
        mask = torch.zeros(talker.config.vocab_size, dtype=torch.bool)
        mask[talker.codec_bos_token] = True  # generate(suppress_tokens=[codec_bos])
        self.register_buffer("suppressed", mask, persistent=False)

    def get_input_embeddings(self) -> Any:
        return self.talker.get_input_embeddings()

    def set_attn_implementation(self, name: str) -> None:
        self.talker.model.set_attn_implementation(name)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor,
                logits_to_keep: torch.Tensor, **kwargs: Any) -> Any:
        kwargs.pop("input_ids", None)
        kwargs.pop("output_hidden_states", None)
        out = self.talker.model(inputs_embeds=inputs_embeds, position_ids=position_ids, **kwargs)
        logits = self.talker.codec_head(out.last_hidden_state[0, logits_to_keep]).float()
        return _Out(logits.masked_fill(self.suppressed, float("-inf"))[None])


@dataclass
class _Out:
    logits: torch.Tensor


@dataclass
class FeedState:
    """One request's view of the thinker stream."""

    prompt_ids: list[int] | None = None
    prompt_rope: torch.Tensor | None = None  # (3, P) thinker rotary positions (images)
    rows: list[torch.Tensor] = field(default_factory=list)  # thinker-width rows, in order
    closed: bool = False
    # the answer less its tool calls: each answer token's verdict, paired in order with
    # its row (which comes one thinker output after its id)
    spoken: SpokenTokens | None = None
    verdicts: deque[bool] = field(default_factory=deque)
    answer_rows: deque[torch.Tensor] = field(default_factory=deque)
    next_codec: torch.Tensor | None = None  # codec embedding of the code just sampled
    codes: list[list[int]] | None = None  # the last frame: [[code], [speaker]]
    speaker: int = 0


class TalkerFeed:
    """Builds the talker's inputs from the thinker stream (see the module doc)."""

    def __init__(self, lm: TalkerLM, speakers: dict[str, dict[str, Any]],
                 markers: dict[str, torch.Tensor], media_ids: set[int],
                 piece: Callable[[int], str]) -> None:
        self.lm, self.talker = lm, lm.talker
        self.piece = piece  # a thinker token id's text: tool calls are not voiced
        self.names = list(speakers)  # release names ("Chelsie"); index = token2wav's row
        self.markers = markers  # thinker embeddings: "eos", "pad", "bos:<name>"
        self.media_ids = media_ids
        self.width = int(self.talker.config.embedding_size)

    def voice(self, name: Any) -> str:
        """The speaker for a request: `name` (case-insensitive) or the release's first."""
        if name is None:
            return self.names[0]
        by_case = {n.casefold(): n for n in self.names}
        if not isinstance(name, str) or name.casefold() not in by_case:
            raise ValueError(f"unknown voice {name!r}; this model's voices: "
                             f"{', '.join(self.names)}")
        return by_case[name.casefold()]

    def new_state(self, seed: int | None, device: torch.device) -> FeedState:
        # one codec stream: the engine's sampler draws it (and seeds it)
        return FeedState(spoken=SpokenTokens(self.piece))

    def info(self) -> dict[str, Any]:
        return {"voices": [{"id": n, "name": n} for n in self.names],
                "codebook_size": int(self.talker.config.vocab_size)}

    @staticmethod
    def frame_output(st: FeedState, codes: list[list[int]]) -> dict[str, Any]:
        return {"codes": codes}

    def _project(self, rows: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.talker.thinker_to_talker_proj(rows)

    # -- the thinker stream -------------------------------------------------------------
    def take(self, st: FeedState, data: dict[str, Any]) -> None:
        """One thinker output: its exported rows (tokens, 2, width) = [embedding, last
        layer] of the positions it fed; the first also carries the prompt's ids."""
        hidden = data.get("hidden_states")
        if st.prompt_ids is None:
            ids = data.get("prompt_token_ids")
            if not isinstance(ids, list) or not isinstance(hidden, torch.Tensor) \
                    or hidden.shape[0] != len(ids):
                raise ValueError("the thinker's first output must carry prompt_token_ids and "
                                 "their hidden_states (export_hidden_layers: auto)")
            st.prompt_ids = ids
            rope = data.get("prompt_rope_positions")
            if rope is not None:
                st.prompt_rope = torch.as_tensor(rope, dtype=torch.float32)
        if hidden is None:  # the last output: its token is never fed, so it has no row
            self._hear(st, data)
            return
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 \
                or hidden.shape[1] != 2 or hidden.shape[2] != self.width:
            raise ValueError(f"talker input needs the thinker's hidden_states as (tokens, 2, "
                             f"{self.width}), got {getattr(hidden, 'shape', type(hidden))}")
        hidden = hidden.to(self.markers["pad"].device, self.markers["pad"].dtype)
        embeds, last = hidden[:, 0], hidden[:, 1]
        prompt_left = len(st.prompt_ids) - min(len(st.rows), len(st.prompt_ids))
        if prompt_left:  # prompt rows: media positions hide their embeddings (generate
            start = len(st.rows)  # zeroes them)
            ids = st.prompt_ids[start:start + len(hidden)]
            keep = torch.tensor([t not in self.media_ids for t in ids] + [True] * (
                len(hidden) - len(ids)), device=hidden.device)
            embeds = embeds * keep[:, None]
        rows = list(embeds + last)
        st.rows += rows[:prompt_left]
        st.answer_rows += rows[prompt_left:]
        self._hear(st, data)

    @staticmethod
    def _hear(st: FeedState, data: dict[str, Any]) -> None:
        """The answer rows whose tokens are heard join the talker's input; a tool call's
        rows never do. The last token has no row, so its id is not judged."""
        final = data.get("finish_reason") is not None
        ids = [] if final else list(data.get("token_ids") or [])
        st.verdicts += [heard for _, heard in st.spoken.decide(ids, final)]
        while st.verdicts and st.answer_rows:
            row = st.answer_rows.popleft()
            if st.verdicts.popleft():
                st.rows.append(row)

    def _answer_rows(self, st: FeedState) -> int:
        return len(st.rows) - len(st.prompt_ids or ())

    def prefill(self, st: FeedState, speaker: str) -> tuple[torch.Tensor, Any] | None:
        """(talker-width prompt rows, layout or None) once answer token 0's row is in."""
        if st.prompt_ids is None or self._answer_rows(st) < 1:
            return None
        st.speaker = self.names.index(speaker)
        p = len(st.prompt_ids)
        codec = self.lm.get_input_embeddings()(torch.tensor(
            [self.talker.codec_pad_token, self.talker.codec_bos_token],
            device=st.rows[0].device))
        tail = torch.stack((self.markers[f"bos:{speaker}"], st.rows[p])) + codec
        embeds = self._project(torch.cat((torch.stack(st.rows[:p]), tail)))
        layout = None
        if st.prompt_rope is not None:  # the text after an image starts past its largest
            top = float(st.prompt_rope.max()) + 1
            after = (torch.arange(2, dtype=torch.float32) + top).expand(3, 2)
            layout = PromptLayout(torch.cat((st.prompt_rope, after), 1), top - p)
        return embeds, layout

    def ready(self, st: FeedState, step: int) -> bool:
        """Decode step `step` can be fed: answer token step+1's row arrived, or the
        answer ended."""
        return st.closed or step + 1 < self._answer_rows(st)

    def decode_input(self, st: FeedState, step: int) -> torch.Tensor:
        g = step + 1  # the answer row this step reads
        if g < self._answer_rows(st):
            text = st.rows[len(st.prompt_ids) + g]
        else:
            text = self.markers["eos"] if g == self._answer_rows(st) else self.markers["pad"]
        return self._project(st.next_codec + text)

    @torch.inference_mode()
    def feedback(self, states: list[FeedState], tokens: list[int], rows: list[int],
                 greedy: list[bool]) -> None:
        """The next step's codec embedding for each sampled code."""
        if not states:
            return
        embeds = self.lm.get_input_embeddings()(
            torch.tensor(tokens, device=self.markers["pad"].device))
        for st, token, embed in zip(states, tokens, embeds, strict=True):
            st.codes, st.next_codec = [[token], [st.speaker]], embed


def load_talker(*, model_dir: str, device: str, dtype: str) -> tuple[CausalLM, TalkerFeed]:
    """The talker of a Qwen2.5-Omni release directory as (CausalLM for the engine, feed)."""
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniTalkerForConditionalGeneration,
    )

    path = Path(model_dir).expanduser().resolve()
    try:
        top = AutoConfig.from_pretrained(str(path), local_files_only=True)
        cfg = top.talker_config
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: no Qwen2.5-Omni talker config: "
                              f"{e}") from e
    speakers = load_speakers(path)
    dev = torch.device(device)
    torch_dtype = _resolve_dtype(dtype, dev, cfg)
    with no_init_weights(), torch.random.fork_rng(devices=[]):
        talker = Qwen2_5OmniTalkerForConditionalGeneration(cfg)
    try:
        talker.load_state_dict(prefixed_tensors(path, TALKER_PREFIX), strict=True)
    except RuntimeError as e:
        raise EngineLoadError(f"model directory {path}: talker weights do not match the "
                              f"config: {e}") from e
    talker.to(dev, torch_dtype).eval().requires_grad_(False)
    table = prefixed_tensors(path, "thinker.model.embed_tokens.")["weight"]
    marker_ids = {"eos": cfg.tts_text_end_token_id, "pad": cfg.tts_text_pad_token_id} | {
        f"bos:{name}": int(s["bos_token"]) for name, s in speakers.items()}
    markers = {k: table[int(i)].to(dev, torch_dtype) for k, i in marker_ids.items()}
    thinker = top.thinker_config
    media = {int(thinker.audio_token_index), int(thinker.image_token_index),
             int(thinker.video_token_index)}
    lm_module = TalkerLM(talker).to(dev)
    feed = TalkerFeed(lm_module, speakers, markers, media, token_text(path))
    stop = {int(cfg.tts_codec_pad_token_id), int(cfg.tts_codec_end_token_id)}
    lm = CausalLM(model=lm_module, tokenizer=None, eos_token_ids=stop, model_dir=str(path),
                  dtype=torch_dtype, device=dev, random_weights=_is_random(path), config=cfg,
                  cache_kwarg=cache_keyword(talker.model.forward), rope=TextFirstRope())
    return lm, feed
