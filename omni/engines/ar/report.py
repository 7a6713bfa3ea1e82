"""What an AR engine (engine.py) tells about itself: info() once at load (the READY
message, /v1/models, the budget check) and stats() every step."""

from __future__ import annotations

from typing import Any

from omni.engines.ar.budget import kv_capacity
from omni.models.tool_calls import tool_format


# engine: an AREngine (typed Any: importing engine.py here would close an import cycle)
def engine_info(engine: Any) -> dict[str, Any]:
    """The model, the KV cache and scheduler sizes, memory, sampling defaults, tool-call
    format and media capabilities."""
    lm, cache, scheduler = engine.lm, engine.cache, engine.scheduler
    return {"model_dir": lm.model_dir, "random_weights": lm.random_weights,
            "dtype": str(lm.dtype).removeprefix("torch."), "device": str(lm.device),
            "kv_cache_dtype": str(cache.k[0].dtype).removeprefix("torch."),
            "vocab_size": lm.vocab_size, "kv_blocks": cache.pool.num_blocks,
            "block_size": cache.block_size, "kv_block_bytes": cache.block_bytes,
            "max_num_seqs": scheduler.max_num_seqs,
            "max_batched_tokens": scheduler.max_batched_tokens,
            "prefill_beside_decodes": scheduler.prefill_beside_decodes,
            "graph_bytes": engine.graphs.pool_bytes if engine.graphs is not None else 0,
            "runtime_bytes": engine.runtime_bytes, "sampling_defaults": engine.defaults,
            "tool_format": tool_format(getattr(lm.config, "model_type", None),
                                       getattr(lm.tokenizer, "chat_template", None)),
            "constrained_decoding": True, **engine.quantized,
            **({"load_format": "dummy"} if lm.load_format == "dummy" else {}),
            **kv_capacity(cache, lm.max_positions),
            **(lm.media.info() if lm.media else {})}


def engine_stats(engine: Any) -> dict[str, Any]:
    """Load and cache use now: sequences, KV blocks, prefix hits, steps, sessions."""
    pool, scheduler, runner = engine.cache.pool, engine.scheduler, engine.runner
    return {"running": len(scheduler.running), "waiting": len(scheduler.waiting),
            "kv_blocks_used": pool.used, "kv_blocks_total": pool.num_blocks,
            "prefix_cache_hits": pool.hits, "preemptions": scheduler.preemptions,
            "steps": runner.steps, "chained_steps": runner.chained_steps,
            "session_bytes": engine.session_kv.nbytes(),
            "session_reused_tokens": engine.session_kv.reused_tokens,
            **_encoder_stats(engine._encoder)}


def _encoder_stats(encoder: Any) -> dict[str, Any]:
    """Media prompts' encoding since start: prompts / batches is the mean batch a vision
    or audio tower call saw (a burst that reached the engine spread out batches worse)."""
    return {"encoder_batches": encoder.batch_count, "encoder_prompts": encoder.prompt_count,
            "encoder_seconds": round(encoder.busy_s, 3)}
