"""Decode steps replayed from CUDA graphs.

A decode-only step (every scheduled sequence adds one token) launches a few hundred
small kernels; at small batch sizes the GPU then waits on Python, not on memory. So the
model's forward is captured once per (batch bucket, context bucket) and replayed. The
graph reads its inputs from static buffers filled before each replay: token ids,
positions, the cache slot each new token is written to, each sequence's length and its
block table padded to the context bucket (the graph expands it to slots). Padding rows
write to a scratch slot that no sequence owns and attend to it alone, so they cannot
disturb real rows.

Every (batch, context) bucket is captured when the engine loads, and the graphs share
one memory pool: a capture while serving stalls every running request of the stage (on
an H200, the first capture of a new context bucket took 10 to 11 s mid-benchmark).
"""

from __future__ import annotations

import bisect
import logging
import time
import traceback
from typing import Any

import torch

from omni.engines.ar.kv_cache import PagedKVCache
from omni.engines.ar.paged_attention import BatchLayout, block_table, table_slots, token_slots
from omni.graph_capture import capturing, forwards_replaced

log = logging.getLogger("omni.engines.ar.decode_graphs")

BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
CONTEXT_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class CaptureError(RuntimeError):
    """A decode forward could not be captured; says where it raised."""


def _buckets(options: tuple[int, ...], limit: int) -> list[int]:
    chosen = [b for b in options if b < limit]
    return chosen + [limit]


class DecodeGraphs:
    """Captured decode forwards of one model over one PagedKVCache."""

    def __init__(self, model: Any, cache: PagedKVCache, max_batch: int, max_context: int,
                 device: torch.device, compile_blocks: list[torch.nn.Module] | None = None,
                 keeps_logits: bool = True, embeds: tuple[int, torch.dtype] | None = None,
                 export_layers: list[int] | None = None) -> None:
        self.model, self.cache, self.device = model, cache, device
        # hidden-state indices to keep per step (a stage feeding the next one its hidden
        # states): captured as graph outputs, `hidden` after each replay
        self.export_layers = export_layers
        self.hidden: torch.Tensor | None = None  # (rows, layers, width) of the last replay
        self.keeps_logits = keeps_logits  # forward() takes logits_to_keep
        # torch.compile fuses the many small elementwise kernels of a decode step (norms,
        # rotary, casts) that dominate it at small batch. Regional compilation: the decoder
        # layers (paged_attention.bind_cache) share one compiled graph, traced once, so a
        # 36-layer model compiles in seconds, not minutes; one dynamic-shape compile serves
        # every bucket (batch 1 is specialised), and the graphs are captured around it.
        # Only captures run the compiled layers: eager (prefill) steps keep the plain ones.
        self.blocks = compile_blocks or []
        self.compiled = [torch.compile(block.forward, dynamic=True) for block in self.blocks]
        self.batch_buckets = _buckets(BATCH_BUCKETS, max_batch)
        self.context_buckets = _buckets(CONTEXT_BUCKETS, max_context)
        block = cache.pool.allocate()  # never released: the padding rows' scratch block
        self.scratch = block * cache.block_size
        b, length = self.batch_buckets[-1], self.context_buckets[-1]
        self.ids = torch.zeros(1, b, dtype=torch.long, device=device)
        # (width, dtype): the model is fed input embeddings (one row per sequence), not ids
        self.embeds = None if embeds is None else torch.zeros(1, b, embeds[0], dtype=embeds[1],
                                                              device=device)
        self.positions = torch.zeros(1, b, dtype=torch.long, device=device)
        self.write = torch.zeros(b, dtype=torch.long, device=device)
        # block tables, expanded to slots on the device inside the graph (table_slots)
        self.tables = torch.zeros(b, cache.blocks_for(length), dtype=torch.long, device=device)
        self.lens = torch.zeros(b, dtype=torch.long, device=device)
        self.keep = torch.arange(b, device=device)
        self.pool: Any = None  # the graphs' shared memory pool, made at the first capture
        self.graphs: dict[tuple[int, int], tuple[Any, torch.Tensor, torch.Tensor | None]] = {}
        self.replays = 0
        self.warmed = False  # every bucket captured: a capture now would stall requests
        self.pool_bytes = 0  # device memory the captured graphs hold (measured by warm)

    def warm(self) -> None:
        """Capture every batch bucket at every context bucket (all rows are padding rows),
        so no request waits on a compile or a capture. The graphs' memory (their pool:
        outputs and scratch) is measured; a stage with a memory budget counts it (budget.py)."""
        # emptied first: a capture empties the allocator's cache itself (torch.cuda.graph),
        # so a baseline with cached free blocks in it made the figure negative (-7384 MiB)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device)
        for length in self.context_buckets:
            started = time.perf_counter()
            for b in self.batch_buckets:
                if (b, length) in self.graphs:
                    continue
                self._fill([], [], [], b, length)
                try:
                    self._capture(b, length)
                except Exception as e:  # say where: the fix is usually in that layer's code
                    frame = traceback.extract_tb(e.__traceback__)[-1]
                    raise CaptureError(f"{type(e).__name__} at {frame.filename}:{frame.lineno}"
                                       f" in {frame.name}: {e}") from e
            log.info("captured the decode graphs for context %d (batch %d to %d) in %.1f s",
                     length, self.batch_buckets[0], self.batch_buckets[-1],
                     time.perf_counter() - started)
        torch.cuda.empty_cache()  # what stays is the graphs' pool (and compiled code's)
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - reserved
        log.info("%d decode graphs hold %.0f MiB", len(self.graphs), self.pool_bytes / 2**20)
        self.warmed = True

    def bucket(self, batch: int, context: int) -> tuple[int, int]:
        """The (batch, context) bucket whose graph runs a step of this size."""
        return (self.batch_buckets[bisect.bisect_left(self.batch_buckets, batch)],
                self.context_buckets[bisect.bisect_left(self.context_buckets, context)])

    def fits(self, batch: int, context: int) -> bool:
        return batch <= self.batch_buckets[-1] and context <= self.context_buckets[-1]

    def run(self, tokens: list[int] | torch.Tensor, positions: list[int],
            tables: list[list[int]], rope_deltas: list[int] | None = None) -> torch.Tensor:
        """Logits (B, V) of one decode step: sequence i feeds tokens[i] (a token id, an
        element of a (B,) tensor of ids on the device, or a row of a (B, width) tensor of
        input embeddings) at positions[i] (its rotary position shifted by rope_deltas[i]:
        see omni/engines/ar/media.py)."""
        n = len(tokens)
        b, length = self.bucket(n, max(positions) + 1)
        self._fill(tokens, positions, tables, b, length, rope_deltas)
        graph, logits, hidden = self.graphs.get((b, length)) or self._capture(b, length)
        graph.replay()
        self.replays += 1
        self.hidden = None if hidden is None else hidden[:n]
        return logits[:n]

    def _fill(self, tokens: list[int] | torch.Tensor, positions: list[int],
              tables: list[list[int]], b: int, length: int,
              rope_deltas: list[int] | None = None) -> None:
        """Fill the static buffers for b rows (the real ones first) and a context of
        length slots. The host sends block tables, not slots: its per-step work must stay
        well under a millisecond next to a few-millisecond replay (expanding slots on the
        host took 1.4 ms per step at batch 32 and context 4096 on a 2-core machine)."""
        n, bs = len(tokens), self.cache.block_size
        scratch_block = self.scratch // bs
        # padding rows: a table of the scratch block, length 1: they write to and attend
        # to the scratch slot only
        table = block_table(tables + [[]] * (b - n), self.cache.blocks_for(length),
                            pad_block=scratch_block)
        write = token_slots(tables, positions, bs)
        pos = torch.tensor(positions + [0] * (b - n), dtype=torch.long)
        if isinstance(tokens, torch.Tensor) and tokens.dim() == 1:  # ids already on the device
            self.ids[0, :n].copy_(tokens)  # padding rows keep earlier (valid) ids
        elif isinstance(tokens, torch.Tensor):  # padding rows keep earlier (finite) values
            self.embeds[0, :n].copy_(tokens)
        else:
            self.ids[0, :b].copy_(torch.tensor(tokens + [0] * (b - n)), non_blocking=True)
        rope = pos if not any(rope_deltas or ()) else pos + torch.tensor(
            list(rope_deltas) + [0] * (b - n), dtype=torch.long)
        self.positions[0, :b].copy_(rope, non_blocking=True)
        self.write[:b].copy_(torch.tensor(write + [self.scratch] * (b - n)), non_blocking=True)
        self.tables[:b, :table.shape[1]].copy_(table, non_blocking=True)
        self.lens[:b].copy_(pos + 1, non_blocking=True)

    def _layout(self, b: int, length: int) -> BatchLayout:
        tables = self.tables[:b, :self.cache.blocks_for(length)]
        slots, valid = table_slots(tables, self.lens[:b], self.cache.block_size, length)
        return BatchLayout(self.cache, self.write[:b], [1] * b, [], [], True,
                           padded_slots=slots, padded_valid=valid, context_len_t=self.lens[:b])

    def _forward(self, b: int, length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        keep = {"logits_to_keep": self.keep[:b]} if self.keeps_logits else {}
        inputs = ({"input_ids": self.ids[:, :b]} if self.embeds is None
                  else {"inputs_embeds": self.embeds[:, :b]})
        with forwards_replaced(self.blocks, self.compiled):
            out = self.model(**inputs, position_ids=self.positions[:, :b],
                             use_cache=False, omni_batch=self._layout(b, length),
                             output_hidden_states=self.export_layers is not None, **keep)
        if self.export_layers is None:
            return out.logits[0], None
        return out.logits[0], torch.stack([out.hidden_states[i][0] for i in self.export_layers],
                                          dim=1)

    def _capture(self, b: int, length: int) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
        started = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits and allocator state before capture
                self._forward(b, length)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with capturing(graph, pool=self.pool):
            logits, hidden = self._forward(b, length)
        self.graphs[(b, length)] = (graph, logits, hidden)
        # a capture while serving stalls every running request of the stage: say how long
        (log.warning if self.warmed else log.debug)(
            "captured the decode graph for batch %d, context %d in %.2f s (%d graphs)",
            b, length, time.perf_counter() - started, len(self.graphs))
        return graph, logits, hidden


def decode_graphs_for(engine: Any, embeds: tuple[int, torch.dtype] | None = None
                      ) -> DecodeGraphs | None:
    """An AR engine's decode graphs over its cache, every bucket captured; None (eager
    decode steps, logged) when a capture fails."""
    limit = min(engine._opt("max_graph_context", 8192), engine.lm.max_positions or 8192)
    compiled = engine.blocks if engine.options.get("compile_decode", True) else None
    graphs = DecodeGraphs(engine.lm.model, engine.cache, engine.scheduler.max_num_seqs, limit,
                          engine.lm.device, compiled,
                          keeps_logits=engine.lm.keeps_logits, embeds=embeds,
                          export_layers=None if engine.export_prompt_only
                          else engine.export_layers)  # decode steps: no prompt rows
    try:
        graphs.warm()
    except Exception as e:  # e.g. a layer that syncs with the host (data-dependent MoE)
        log.warning("CUDA graphs disabled for %s: capture failed (%s: %s); decode "
                    "steps run eagerly", engine.lm.model_dir, type(e).__name__, e)
        engine.cache.pool.release(graphs.scratch // engine.cache.block_size)
        torch.cuda.synchronize(engine.lm.device)
        return None
    return graphs
