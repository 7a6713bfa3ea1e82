"""Qwen3-Omni-MoE's talker as an AR-engine stage fed by the thinker's stream.

What the model defines (transformers' ``Qwen3OmniMoeForConditionalGeneration.generate``,
re-expressed per request and per chunk so the talker can start while the thinker writes):
- Prefill = the user turns of the thinker prompt (text tokens: ``text_projection`` of the
  thinker's input embeddings; audio/image/video tokens: ``hidden_projection`` of the
  thinker layer ``accept_hidden_layer``) + 9 assistant positions: "<|im_start|>assistant\\n"
  (projected, no codec), 4 x tts_pad over codec nothink/think_bos/think_eos/speaker,
  tts_bos over codec_pad, the first answer token over codec_bos.
- Decode step g: the input is the sum of the codec embeddings of the frame just sampled
  (the talker's first code + the code predictor's residual codes) plus the projected
  embedding of answer token g+1; after the answer, tts_eos once, then tts_pad. A step whose
  answer token has not arrived yet waits (the engine holds the sequence): no guesses.
- The first code comes from ``codec_head`` with the top 1024 ids suppressed except
  codec_eos; the code predictor (a small dense LM, run here as a batched loop over its own
  short cache) draws the residual codes from the talker's last hidden state.

The answer tokens: transformers' generate feeds the talker the thinker's layer-0 hidden
states of the answer, which are the thinker's embeddings of its answer tokens (and the last
token, never fed back to the thinker, has none). So the talker reads the answer as token
ids and embeds them itself with the thinker's table: the thinker exports the prompt's
hidden states only (CausalLM.export_prompt_only), no 8 KiB row per token crosses
processes, and answer token t is known with the thinker output that samples it, a thinker
step earlier than its hidden state (the talker's prefill starts at the thinker's TTFT).

Loading: the combined checkpoint's ``talker.*`` tensors, experts fused into the in-memory
layout, ``load_state_dict(strict=True)`` (never silently random); plus the thinker's
embedding table (``TalkerLM.thinker_embed``: the answer tokens and tts_bos / tts_eos /
tts_pad), which the talker projects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni.engines.base import EngineLoadError, PromptLayout, flag_option
from omni.models.causal_lm import CausalLM, _is_random, _resolve_dtype, cache_keyword
from omni.models.checkpoint_parts import fuse_experts, prefixed_tensors
from omni.models.codec_talker import CodecInputs, CodecTalkerLM
from omni.models.predictor_kv import supported
from omni.models.qwen3_omni_predictor import PredictorGraphs, make_graphs, predict_cached
from omni.models.qwen3_omni_vision import TextFirstRope
from omni.models.spoken_tokens import SpokenTokens, token_text

TALKER_PREFIX = "talker."
def talker_layout(thinker_rope: torch.Tensor, keep: list[int], tail: int) -> PromptLayout:
    """The talker's rotary positions: what the model's get_rope_index gives for the talker
    sequence (the kept thinker positions `keep`, then `tail` assistant positions). That
    function makes every text token or media block start one past the largest position
    before it, so dropping a segment (a system turn) shifts every later position by the
    same amount: each run of consecutive kept positions keeps its thinker positions, shifted
    to start one past the talker's largest position so far."""
    # one slice per run, not per position (27 ms for 2,500 positions, before the prefill)
    index = torch.tensor(keep, dtype=torch.long)
    breaks = (torch.nonzero(index[1:] != index[:-1] + 1).flatten() + 1).tolist()
    rows, next_pos = [], 0.0
    for start, end in zip([0, *breaks], [*breaks, len(keep)], strict=True) if keep else ():
        run = thinker_rope[:, index[start:end]]
        pos = run - (float(run[:, 0].min()) - next_pos)
        rows.append(pos)
        next_pos = max(next_pos, float(pos.max()) + 1)
    tail_pos = (torch.arange(tail, dtype=thinker_rope.dtype) + next_pos).expand(3, tail)
    rope = torch.cat((*rows, tail_pos), 1)
    return PromptLayout(rope, rope_delta=next_pos - len(keep))


class TalkerLM(CodecTalkerLM):
    """Qwen3-Omni's talker as the AR engine calls it (codec_talker.py), with the thinker's
    embedding table its feed reads the answer's tokens through."""

    def __init__(self, talker: Any, thinker_embed: torch.Tensor) -> None:
        vocab = talker.config.text_config.vocab_size
        mask = torch.zeros(vocab, dtype=torch.bool)
        mask[max(0, vocab - 1024):] = True  # generate() suppresses these, except codec_eos
        mask[talker.config.codec_eos_token_id] = False
        super().__init__(talker, mask)
        # the thinker's embedding table (its layer-0 hidden state of any text token);
        # a module of the stage's model, so its memory counts among the weights
        self.thinker_embed = torch.nn.Embedding.from_pretrained(thinker_embed, freeze=True)

    def set_attn_implementation(self, name: str) -> None:
        """The engine's attention for the talker LM; the code predictor keeps its own."""
        self.talker.model.set_attn_implementation(name)


@dataclass
class FeedState:
    """One request's view of the thinker stream."""

    prompt_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None  # (P, Ht) thinker layer 0
    prompt_hidden: torch.Tensor | None = None  # (P, Ht) thinker accept layer
    prompt_rope: torch.Tensor | None = None  # (3, P) thinker rotary positions (images)
    answer: list[torch.Tensor] = field(default_factory=list)  # projected answer tokens
    # answer token ids as received, embedded and projected in one batched call for a
    # whole engine step when a step needs them (TalkerFeed.prepare)
    pending: list[int] = field(default_factory=list)
    closed: bool = False
    spoken: SpokenTokens | None = None  # the answer's ids less its tool calls
    next_codec: torch.Tensor | None = None  # summed codec embeddings of the last frame
    codes: list[int] | None = None  # the last frame's codes, one per code group
    generator: torch.Generator | None = None


class TalkerFeed(CodecInputs):
    """Builds the talker's inputs from the thinker stream (see the module doc)."""

    # stage options beside the AR engine's: predictor_compile (false) compiles the code
    # predictor's layers inside its CUDA graphs, as Qwen3-TTS's talker does by default
    # (there its share of a step at batch 8 went 12.7 -> 5.5 ms on an H100,
    # bench/results/qwen3-tts-ar-step-h100.md); not yet measured on this talker.
    # predictor_kv_cache (false): the graphs capture the static-KV loop (predictor_kv.py)
    OPTIONS = frozenset({"predictor_compile", "predictor_kv_cache"})
    predictor_compile = False
    predictor_kv_cache = False

    def __init__(self, lm: TalkerLM, special: torch.Tensor, speaker_ids: dict[str, int],
                 top: Any, piece: Callable[[int], str]) -> None:
        cfg = lm.talker.config
        self.lm, self.cfg, self.top = lm, cfg, top
        self.piece = piece  # a thinker token id's text: tool calls are not voiced
        self.speakers = speaker_ids
        self.thinker_vocab = lm.thinker_embed.num_embeddings  # read per thinker token
        self.num_groups = int(cfg.num_code_groups)
        self.cache_key = cache_keyword(lm.talker.code_predictor.model.forward)
        self.graphs: PredictorGraphs | None = None  # use_cuda_graphs
        with torch.inference_mode():
            self.tts_bos, self.tts_eos, self.tts_pad = lm.talker.text_projection(special)
        self.mm_ids = {top.thinker_config.audio_token_id, top.thinker_config.image_token_id,
                       top.thinker_config.video_token_id}

    def voice(self, name: Any) -> str:
        """The speaker for a request: `name` (case-insensitive) or the first one."""
        if name is None:
            return next(iter(sorted(self.speakers)))
        if not isinstance(name, str) or name.lower() not in self.speakers:
            raise ValueError(f"unknown voice {name!r}; this model's voices: "
                             f"{', '.join(sorted(self.speakers))}")
        return name.lower()

    def new_state(self, seed: int | None, device: torch.device) -> FeedState:
        generator = None if seed is None else torch.Generator(device).manual_seed(seed + 1)
        return FeedState(generator=generator, spoken=SpokenTokens(self.piece))

    def info(self) -> dict[str, Any]:
        # ids as the config spells them ("ethan"), names as the model card does ("Ethan")
        return {"voices": [{"id": v, "name": v.capitalize()} for v in sorted(self.speakers)],
                "num_code_groups": self.num_groups,
                "codebook_size": int(self.cfg.code_predictor_config.vocab_size)}

    @staticmethod
    def frame_output(st: FeedState, codes: list[int]) -> dict[str, Any]:
        """One frame as the code2wav stage takes it: (num_code_groups, 1)."""
        return {"codes": [[c] for c in codes]}

    # -- the thinker stream -----------------------------------------------------------
    def take(self, st: FeedState, data: dict[str, Any]) -> None:
        """One thinker output: the first carries the prompt's hidden states (tokens, 2, Ht)
        = layers [0, accept] and its ids; every one its sampled token ids."""
        if st.prompt_ids is None:
            self._take_prompt(st, data)
        ids, vocab = data.get("token_ids", []), self.thinker_vocab
        if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids):
            raise ValueError(f"talker input needs the thinker's token_ids (ids in [0, "
                             f"{vocab})), got {str(ids)[:80]}")
        # the last token is never fed back, so never heard; a tool call is not heard either
        final = data.get("finish_reason") is not None
        st.pending += st.spoken.push([] if final else ids, final)

    def _take_prompt(self, st: FeedState, data: dict[str, Any]) -> None:
        hidden, ids = data.get("hidden_states"), data.get("prompt_token_ids")
        width = self.cfg.thinker_hidden_size
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[1] != 2 \
                or hidden.shape[2] != width:
            raise ValueError(f"talker input needs the thinker's prompt hidden_states as "
                             f"(tokens, 2, {width}) (export_hidden_layers: auto), got "
                             f"{getattr(hidden, 'shape', type(hidden).__name__)}")
        if not isinstance(ids, list) or len(ids) != hidden.shape[0]:
            raise ValueError("the thinker's first output must carry prompt_token_ids for "
                             "every prompt position it exports")
        hidden = hidden.to(self.lm.suppressed.device, self.tts_pad.dtype)
        st.prompt_ids, st.prompt_embeds, st.prompt_hidden = ids, hidden[:, 0], hidden[:, 1]
        rope = data.get("prompt_rope_positions")
        if rope is not None:
            st.prompt_rope = torch.as_tensor(rope, dtype=torch.float32)
            if st.prompt_rope.shape != (3, len(ids)):
                raise ValueError("prompt_rope_positions must be (3, prompt tokens)")

    def prepare(self, states: list[FeedState]) -> None:
        """Embed and project the received answer tokens of a step's sequences in one call
        (per token on arrival, it was a launch and a host-to-device copy each, on the
        talker's main thread: 28,800 for 32 answers of 900 tokens)."""
        waiting = [st for st in states if st.pending]
        if not waiting:
            return
        ids = torch.tensor([t for st in waiting for t in st.pending],
                           device=self.lm.suppressed.device)
        with torch.inference_mode():
            projected = list(self.lm.talker.text_projection(self.lm.thinker_embed(ids)))
        start = 0
        for st in waiting:
            st.answer += projected[start:start + len(st.pending)]
            start += len(st.pending)
            st.pending = []

    @staticmethod
    def answer_tokens(st: FeedState) -> int:
        """Answer tokens received so far, projected or not."""
        return len(st.answer) + len(st.pending)

    def prefill(self, st: FeedState, speaker: str) -> tuple[torch.Tensor, Any] | None:
        """((positions, H) talker prompt, its PromptLayout or None) once the first answer
        token is known, else None."""
        if st.prompt_ids is None or not self.answer_tokens(st):
            return None
        self.prepare([st])
        ids, p = st.prompt_ids, self.top
        keep = self._user_positions(st)
        user = self._user_part(st, keep)
        im_start, assistant = p.im_start_token_id, p.assistant_token_id
        starts = [i for i in range(len(ids) - 1)
                  if ids[i] == im_start and ids[i + 1] == assistant]
        if not starts:
            raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn")
        a = starts[-1]
        with torch.inference_mode():
            head = self.lm.talker.text_projection(st.prompt_embeds[a:a + 3])
            c = self.cfg
            codec_ids = [c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id,
                         self.speakers[speaker], c.codec_pad_id, c.codec_bos_id]
            codec = self.lm.get_input_embeddings()(
                torch.tensor(codec_ids, device=head.device))
            text = torch.stack([self.tts_pad] * 4 + [self.tts_bos, st.answer[0]])
            embeds = torch.cat((user, head, text + codec))
        layout = None if st.prompt_rope is None else talker_layout(
            st.prompt_rope, keep, len(embeds) - len(keep))
        return embeds, layout

    def _user_positions(self, st: FeedState) -> list[int]:
        """The thinker prompt positions of the user turns (what the talker hears)."""
        ids = st.prompt_ids
        # ids read once: a config attribute read per position cost 10-30 ms a request
        im_start, user = self.top.im_start_token_id, self.top.user_token_id
        role, keep = None, []
        for i, t in enumerate(ids):
            if t == im_start and i + 1 < len(ids):
                role = ids[i + 1]
            if role == user:
                keep.append(i)
        return keep

    def _user_part(self, st: FeedState, keep: list[int]) -> torch.Tensor:
        ids = st.prompt_ids
        index = torch.tensor(keep, dtype=torch.long, device=st.prompt_embeds.device)
        mm = torch.tensor([ids[i] in self.mm_ids for i in keep], device=index.device)
        with torch.inference_mode():
            text = self.lm.talker.text_projection(st.prompt_embeds[index])
            if bool(mm.any()):
                projected = self.lm.talker.hidden_projection(st.prompt_hidden[index])
                text = torch.where(mm[:, None], projected, text)
        return text

    def ready(self, st: FeedState, step: int) -> bool:
        """Decode step `step` can be fed: its answer token arrived, or the answer ended."""
        return st.closed or step + 1 < self.answer_tokens(st)

    def text_input(self, st: FeedState, step: int) -> torch.Tensor:
        """The text embedding decode step ``step`` reads: the answer token after the one
        the step's codec follows, then tts_eos once, then tts_pad."""
        if step + 1 >= len(st.answer) and st.pending:  # not prepared with its step
            self.prepare([st])
        if step + 1 < len(st.answer):
            return st.answer[step + 1]
        return self.tts_eos if step + 1 == len(st.answer) else self.tts_pad

    # -- after sampling -------------------------------------------------------------------
    @torch.inference_mode()
    def feedback(self, states: list[FeedState], tokens: list[int], rows: list[int],
                 greedy: list[bool]) -> None:
        """Residual codes for each sampled first code, and the next step's codec input;
        rows: each state's row among the last forward's kept positions."""
        if not states:
            return
        dev = self.lm.suppressed.device
        first = torch.tensor(tokens, device=dev)
        first_embed = self.lm.talker.get_input_embeddings()(first)
        hidden = self.lm.last_hidden[torch.tensor(rows, dtype=torch.long, device=dev)]
        draws = self._uniforms(states, dev)
        is_greedy = torch.tensor(greedy, device=dev)
        done = None if self.graphs is None else self.graphs.run(hidden, first_embed, draws,
                                                                is_greedy)
        residual, total = done or predict_cached(self.lm.talker.code_predictor, self.cache_key,
                                                 hidden, first_embed, draws, is_greedy)
        frame = torch.cat((first[:, None], residual), dim=1).tolist()  # one sync per step
        for i, st in enumerate(states):
            st.codes, st.next_codec = frame[i], total[i]

    def reserve(self, rows: int) -> None:
        self.lm.reserve(rows)

    def use_cuda_graphs(self, max_batch: int) -> bool:
        """Capture the code-predictor loop for batches up to max_batch (CUDA only)."""
        emb = self.lm.talker.get_input_embeddings().weight
        if emb.device.type != "cuda":
            return False
        self.graphs = make_graphs(self.lm.talker.code_predictor, emb.shape[1],
                                  self.num_groups, emb.dtype, emb.device, max_batch,
                                  compiled=self.predictor_compile,
                                  kv_cache=self.predictor_kv_cache
                                  and supported(self.lm.talker.code_predictor))
        return self.graphs is not None

    def _uniforms(self, states: list[FeedState], dev: torch.device) -> torch.Tensor:
        """(B, groups-1) uniform draws, one call per request on its own generator (so a
        seeded request samples the same codes in any batch); the picks are batched."""
        n = self.num_groups - 1
        return torch.stack([torch.rand(n, device=dev, generator=st.generator) for st in states])


def load_talker(*, model_dir: str, device: str, dtype: str,
                options: Mapping[str, Any] | None = None) -> tuple[CausalLM, TalkerFeed]:
    """The talker of a combined Qwen3-Omni directory as (CausalLM for the engine, feed);
    ``options``: the stage's (TalkerFeed.OPTIONS are read)."""
    from transformers import AutoConfig
    from transformers.initialization import no_init_weights
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerForConditionalGeneration,
    )

    path = Path(model_dir).expanduser().resolve()
    try:
        top = AutoConfig.from_pretrained(str(path), local_files_only=True)
        cfg = top.talker_config
    except Exception as e:
        raise EngineLoadError(f"model directory {path}: no Qwen3-Omni talker config: {e}") from e
    dev = torch.device(device)
    torch_dtype = _resolve_dtype(dtype, dev, cfg.text_config)
    tensors = fuse_experts(prefixed_tensors(path, TALKER_PREFIX))
    with no_init_weights(), torch.random.fork_rng(devices=[]):
        talker = Qwen3OmniMoeTalkerForConditionalGeneration(cfg)
    try:
        talker.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        raise EngineLoadError(f"model directory {path}: talker weights do not match the "
                              f"config: {e}") from e
    talker.to(dev, torch_dtype).eval().requires_grad_(False)
    embed_table = prefixed_tensors(path, "thinker.model.embed_tokens.")["weight"]
    lm_module = TalkerLM(talker, embed_table.to(dev, torch_dtype)).to(dev)
    special = lm_module.thinker_embed.weight[[top.tts_bos_token_id, top.tts_eos_token_id,
                                              top.tts_pad_token_id]]
    feed = TalkerFeed(lm_module, special,
                      {k.lower(): int(v) for k, v in (cfg.speaker_id or {}).items()}, top,
                      token_text(path))
    feed.predictor_compile = flag_option(options or {}, "predictor_compile", False)
    feed.predictor_kv_cache = flag_option(options or {}, "predictor_kv_cache", False)
    lm = CausalLM(model=lm_module, tokenizer=None, eos_token_ids={int(cfg.codec_eos_token_id)},
                  model_dir=str(path), dtype=torch_dtype, device=dev,
                  random_weights=_is_random(path), config=cfg.text_config,
                  cache_kwarg=cache_keyword(talker.model.forward), rope=TextFirstRope())
    return lm, feed

