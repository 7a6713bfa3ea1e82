"""CUDA graphs for the π0 adapter (omni/models/pi0.py): its flow-matching step and its
prefix pass replayed from graphs, so a chunk no longer waits on the host launching every
kernel (eager π0 at batch 1 on the H200 is bound by launches: bench/results/robots-h200.md).

- What a graph holds: the step's body (action + time embedding, the expert's layers, the
  output projection) and the prefix pass's body (SigLIP, ``embed_prefix``, the VLM's
  layers); one graph per bucket of ``graph_batch_sizes`` (a batch runs in the smallest
  bucket that holds it; the rows past it compute on stale inputs and are dropped), per
  prefix length for the step and per camera count for the prefix (prompts are padded to a
  fixed length, so the prefix length is fixed per camera count).
- What stays outside: the attention masks and position ids. transformers' mask builders
  may sync with the host, which a capture forbids; the masks depend only on the robots'
  prompt masks, so they are built when the batch's robots change and copied into the static
  buffers with the robots' states and prefix KV. Per step only the actions and timesteps
  are copied in, and the velocity is cloned out.
- Caches: the step's cache layers are fixed buffers (prefix + the step's own tokens); the
  step writes its keys after the prefix, so nothing grows across replays (eager π0 appends
  and crops). The prefix pass's layers keep what the VLM hands them.
- All graphs share one memory pool; every output is cloned before the next replay.
- A capture that fails, or whose replay differs from the eager run before it, turns the
  graphs off with a warning; the adapter then runs eagerly (a load never fails for it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer
from transformers.masking_utils import create_causal_mask

from omni.engines.base import PolicyJob
from omni.graph_capture import capturing
from omni.models.causal_lm import cache_keyword

log = logging.getLogger("omni.models.pi0")

# the KV cache's keyword to the mask builder and the models: "cache" from transformers 5.24
# on, "past_key_values" before (setup.cfg's floor is older)
CACHE_KWARG = cache_keyword(create_causal_mask)

BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # the policy engine's max_batch is 32
PREFIX_MAX_BATCH = 8  # the engine admits 8 observations per step by default; more: eager


class SlotLayer(DynamicLayer):
    """One layer of the step's cache: a fixed (batch, kv heads, prefix + step, dim)
    buffer whose prefix is filled outside the graph; each step writes its keys after it."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, prefix_len: int) -> None:
        super().__init__()
        self.keys, self.values, self.prefix_len = keys, values, prefix_len
        self.device, self.is_initialized = keys.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys[:, :, self.prefix_len:].copy_(key_states)
        self.values[:, :, self.prefix_len:].copy_(value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prefix_len


class RecordLayer(DynamicLayer):
    """One layer of the prefix pass's cache: keeps what it is handed, contiguous (as the
    eager pass's append to an empty cache leaves it)."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys, self.values = key_states.contiguous(), value_states.contiguous()
        self.device, self.is_initialized = key_states.device, True
        return self.keys, self.values


def _rows(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors))


def _tensors(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for pair in out for t in pair]


def capture(body: Callable[[], Any], pool: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Warm up on a side stream, capture, replay once and check the replay against the
    last eager run on the same buffers."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            eager = body()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with capturing(graph, pool=pool, capture_error_mode="thread_local"):
        out = body()
    graph.replay()
    for a, b in zip(_tensors(out), _tensors(eager), strict=True):
        if not torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2, equal_nan=True):
            diff = float((a.float() - b.float()).abs().nan_to_num(0).max())
            raise RuntimeError(f"the graph's replay differs from the eager run by {diff}")
    return graph, out


class _Graphs:
    """Graphs of one body over static buffers, one per batch bucket, captured on first use
    (``pool`` None: no graphs, the body runs eagerly; the CPU tests check it so)."""

    def __init__(self, model: Any, buckets: Sequence[int], pool: Any) -> None:
        self.model, self.buckets, self.pool = model, sorted(buckets), pool
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Any]] = {}

    @property
    def rows(self) -> int:
        return self.buckets[-1]

    def bucket(self, n: int) -> int | None:
        return next((b for b in self.buckets if b >= n), None)

    def body(self, b: int) -> Any:
        raise NotImplementedError

    def replay(self, b: int) -> Any:
        if self.pool is None:
            return self.body(b)
        if b not in self.graphs:
            self.graphs[b] = capture(lambda: self.body(b), self.pool)
        graph, out = self.graphs[b]
        graph.replay()
        return out


class StepGraphs(_Graphs):
    """The step's graphs for one prefix length (``example``: a job after its prefix)."""

    def __init__(self, model: Any, example: PolicyJob, buckets: Sequence[int],
                 pool: Any) -> None:
        super().__init__(model, buckets, pool)
        self.prefix_len = example.prefix["mask"].shape[1]
        self.horizon = int(model.config.chunk_size)
        length = self.prefix_len + self.horizon + 1
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        for pair in example.prefix["kv"]:  # every row the example's, until robots come
            k, v = (x.new_zeros(self.rows, x.shape[1], length, x.shape[3]) for x in pair)
            k[:, :, :self.prefix_len].copy_(pair[0][:1])
            v[:, :, :self.prefix_len].copy_(pair[1][:1])
            self.kv.append((k, v))
        self.state = example.state[:1].expand(self.rows, -1).clone()
        self.actions = example.actions[:1].expand(self.rows, -1, -1).clone()
        self.t = torch.ones(self.rows, device=self.actions.device)
        mask, pos = self.masks(example.prefix["mask"])
        self.mask = mask.expand(self.rows, *mask.shape[1:]).clone()
        self.pos = pos.expand(self.rows, -1).clone()
        self.loaded: tuple = ()

    def masks(self, prefix_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The expert's 4D mask and position ids, as PI0Model.forward builds them."""
        n, suffix = prefix_mask.shape[0], self.horizon + 1
        mask = torch.cat([prefix_mask, prefix_mask.new_ones(n, suffix)], dim=1)
        device = prefix_mask.device
        blocks = torch.cat([torch.zeros(self.prefix_len + 1, device=device, dtype=torch.long),
                            torch.ones(suffix - 1, device=device, dtype=torch.long)])
        config = self.model.config.dit_config
        mask4d = create_causal_mask(
            config=config, attention_mask=mask, block_sequence_ids=blocks[None].repeat(n, 1),
            inputs_embeds=self.actions.new_empty(n, suffix, config.hidden_size),
            **{CACHE_KWARG: Cache(layers=[SlotLayer(k[:n], v[:n], self.prefix_len)
                                          for k, v in self.kv])})
        if not isinstance(mask4d, torch.Tensor) or mask4d.ndim != 4:
            raise RuntimeError(f"the expert's mask came back as {type(mask4d).__name__}")
        return mask4d, (mask.cumsum(1) - 1)[:, -suffix:]

    def load(self, jobs: list[PolicyJob]) -> None:
        """The robots' states, prefix KV and masks into rows 0..n-1, when they changed."""
        key = tuple((j.request_id, id(j)) for j in jobs)
        if key == self.loaded:
            return
        n, length = len(jobs), self.prefix_len
        self.loaded = ()
        for i, (k, v) in enumerate(self.kv):
            k[:n, :, :length].copy_(_rows([j.prefix["kv"][i][0] for j in jobs]))
            v[:n, :, :length].copy_(_rows([j.prefix["kv"][i][1] for j in jobs]))
        self.state[:n].copy_(_rows([j.state for j in jobs]))
        mask, pos = self.masks(_rows([j.prefix["mask"] for j in jobs]))
        self.mask[:n].copy_(mask)
        self.pos[:n].copy_(pos)
        self.loaded = key

    def run(self, jobs: list[PolicyJob], actions: torch.Tensor,
            timesteps: torch.Tensor) -> torch.Tensor | None:
        n = len(jobs)
        b = self.bucket(n)
        if b is None:
            return None
        self.load(jobs)
        self.actions[:n].copy_(actions)
        self.t[:n].copy_(timesteps)
        return self.replay(b)[:n].clone()

    def body(self, b: int) -> torch.Tensor:
        m = self.model
        cache = Cache(layers=[SlotLayer(k[:b], v[:b], self.prefix_len) for k, v in self.kv])
        embeds = m.embed_action_time(self.state[:b], self.actions[:b], self.t[:b])
        hidden = m.model.dit(inputs_embeds=embeds, attention_mask=self.mask[:b],
                             position_ids=self.pos[:b], **{CACHE_KWARG: cache}
                             ).last_hidden_state
        return m.action_out_proj(hidden[:, -self.horizon:])


class PrefixGraphs(_Graphs):
    """The prefix pass's graphs for one camera count (``example``: a prepared job)."""

    def __init__(self, model: Any, example: PolicyJob, buckets: Sequence[int],
                 pool: Any) -> None:
        super().__init__(model, buckets, pool)
        text = model.model.vlm.config.get_text_config()
        if getattr(text, "sliding_window", None) is not None:
            raise RuntimeError("a VLM with sliding-window layers (two masks) is not graphed")
        self.text_config, self.layers = text, int(text.num_hidden_layers)
        inputs = example.inputs
        pixels = inputs["pixel_values"]
        self.pixels = pixels.expand(self.rows, *pixels.shape[1:]).clone()
        self.ids = inputs["input_ids"].expand(self.rows, -1).clone()
        self.cameras = torch.ones(self.rows, pixels.shape[1], dtype=torch.bool,
                                  device=pixels.device)
        mask, pos = self.masks(inputs["attention_mask"])
        self.mask = mask.expand(self.rows, *mask.shape[1:]).clone()
        self.pos = pos.expand(self.rows, -1).clone()

    def masks(self, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VLM's 4D mask and position ids, as sample_actions + PaliGemmaModel build
        them (the whole prefix one bidirectional block)."""
        pos = mask.cumsum(-1) - 1
        mask4d = create_causal_mask(
            config=self.text_config, attention_mask=mask, **{CACHE_KWARG: None},
            position_ids=pos,
            inputs_embeds=self.pixels.new_empty(*mask.shape, self.text_config.hidden_size),
            block_sequence_ids=torch.zeros_like(mask))
        if not isinstance(mask4d, torch.Tensor) or mask4d.ndim != 4:
            raise RuntimeError(f"the VLM's mask came back as {type(mask4d).__name__}")
        return mask4d, pos

    def run(self, jobs: list[PolicyJob]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        n = len(jobs)
        b = self.bucket(n)
        if b is None:
            return None
        self.pixels[:n].copy_(_rows([j.inputs["pixel_values"] for j in jobs]))
        self.ids[:n].copy_(_rows([j.inputs["input_ids"] for j in jobs]))
        mask, pos = self.masks(_rows([j.inputs["attention_mask"] for j in jobs]))
        self.mask[:n].copy_(mask)
        self.pos[:n].copy_(pos)
        return [(k[:n].clone(), v[:n].clone()) for k, v in self.replay(b)]

    def body(self, b: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        cache = Cache(layers=[RecordLayer() for _ in range(self.layers)])
        embeds = self.model.model.embed_prefix(self.ids[:b], self.pixels[:b],
                                               self.cameras[:b])
        self.model.model.vlm.language_model(
            inputs_embeds=embeds, attention_mask=self.mask[:b], position_ids=self.pos[:b],
            **{CACHE_KWARG: cache}, use_cache=True)
        return [(layer.keys, layer.values) for layer in cache.layers]


class PI0Graphs:
    """The adapter's graphs: prefix graphs per camera count, step graphs per prefix
    length, all in one pool. ``prefix`` / ``velocity`` return None where the adapter must
    run eagerly (that pass's graphs off, or a batch past the largest bucket); a failure
    turns off only the pass it happened in."""

    def __init__(self, model: Any, batch_sizes: Sequence[int], capture: bool = True) -> None:
        self.model = model
        self.step_buckets = sorted(set(batch_sizes))
        self.prefix_buckets = [b for b in self.step_buckets if b <= PREFIX_MAX_BATCH]
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.steps: dict[Any, StepGraphs] = {}
        self.prefixes: dict[Any, PrefixGraphs] = {}
        self.off: dict[str, str] = {}  # pass -> why its graphs are off
        self.held = self.replays = 0

    def prefix(self, jobs: list[PolicyJob]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if not self.prefix_buckets:
            return None
        return self._guard("prefix", lambda: self._prefix_graphs(jobs[0]).run(jobs))

    def velocity(self, jobs: list[PolicyJob], actions: torch.Tensor,
                 timesteps: torch.Tensor) -> torch.Tensor | None:
        return self._guard("step", lambda: self._step_graphs(jobs[0]).run(
            jobs, actions, timesteps))

    def capture_all(self, job: PolicyJob) -> None:
        """Every bucket for this job's shapes (at load: the release's camera count)."""
        for name, graphs in (("step", self._step_graphs), ("prefix", self._prefix_graphs)):
            if name == "step" or self.prefix_buckets:
                self._guard(name, lambda get=graphs: self._capture_each(get(job)))

    @staticmethod
    def _capture_each(graphs: _Graphs) -> None:
        for b in reversed(graphs.buckets):  # largest first: the smaller reuse its memory
            graphs.replay(b)

    def info(self) -> dict[str, Any]:
        state = ("on" if not self.off else f"off ({self.off['step']})" if "step" in self.off
                 else f"step only (prefix pass: {self.off['prefix']})")
        return {"cuda_graphs": state,
                "graph_batch_sizes": self.step_buckets,
                "graph_memory_mib": round(self.held / 2**20, 1)}

    def _step_graphs(self, job: PolicyJob) -> StepGraphs:
        key = job.step_key
        if key not in self.steps:
            self.steps[key] = StepGraphs(self.model, job, self.step_buckets, self.pool)
        return self.steps[key]

    def _prefix_graphs(self, job: PolicyJob) -> PrefixGraphs:
        key = job.prefix_key
        if key not in self.prefixes:
            self.prefixes[key] = PrefixGraphs(self.model, job, self.prefix_buckets, self.pool)
        return self.prefixes[key]

    def _guard(self, name: str, fn: Callable[[], Any]) -> Any:
        if name in self.off:
            return None
        reserved = torch.cuda.memory_reserved() if self.pool is not None else 0
        captured = self._count()
        try:
            with torch.inference_mode():
                out = fn()
        except Exception as e:  # noqa: BLE001 - graphs are a speed-up: eager stays correct
            self.off[name] = f"{type(e).__name__}: {e}"
            log.warning("π0 CUDA graphs of the %s pass turned off, it runs eagerly: %s",
                        name, self.off[name], exc_info=True)
            return None
        if self.pool is not None and self._count() != captured:
            self.held += torch.cuda.memory_reserved() - reserved
            log.info("π0 CUDA graphs: %d captured, %.1f MiB", self._count(),
                     self.held / 2**20)
        self.replays += out is not None
        return out

    def _count(self) -> int:
        return sum(len(g.graphs) for g in [*self.steps.values(), *self.prefixes.values()])
