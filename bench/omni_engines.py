"""The critical path of a spoken answer, each part measured on its own engine in this process.

  thinker   request added -> first text token out (its TTFT: prefill + first sample)
  talker    the thinker's whole output appended at once -> `first_chunk_frames` codec frames
  code2wav  those frames appended -> the first audio chunk out (the pipeline's audio stage:
            Qwen2.5-Omni's token2wav, which decodes a whole utterance, takes all the
            talker's frames and its one chunk)

The stages are the server's (same model directory, stage options and params, built with
the same `build_engine`), so the path is what the pipeline could do with zero time in
queues and hops. Each part is timed `repeats` times after one warm-up; the median counts.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from omni.config.pipeline import PipelineConfig
from omni.config.stages import StageConfig
from omni.engines import build_engine
from omni.engines.base import Engine, EngineRequest
from omni.engines.proc import EngineSpec


def _engine(stage: StageConfig, dtype: str) -> Engine:
    return build_engine(EngineSpec(
        replica_id=f"bench-{stage.name}", stage=stage.name, engine=stage.engine,
        control_address="", model=stage.model, model_dir=stage.model_dir,
        device=stage.devices[0], dtype=dtype, memory=stage.memory,
        options={k: v for k, v in stage.options.items() if k != "payload_arena_mb"}))


def _sync(engine: Engine) -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _until(engine: Engine, done: Any, limit_steps: int = 100_000) -> list[Any]:
    """Step until done(outputs so far) or the engine has no work; every output, in order."""
    outs: list[Any] = []
    for _ in range(limit_steps):
        if done(outs) or not engine.has_work():
            return outs
        for out in engine.step():
            if out.error:
                raise RuntimeError(f"{out.request_id}: {out.error}")
            outs.append(out)
    raise RuntimeError("the engine did not finish in time")


def _drain(engine: Engine, request_id: str) -> None:
    engine.abort([request_id])
    while engine.has_work():
        engine.step()


def _thinker(engine: Engine, rid: str, messages: list, params: dict) -> tuple[float, list]:
    start = time.perf_counter()
    engine.add(EngineRequest(rid, {"messages": messages}, params))
    outs = _until(engine, lambda o: any((x.data or {}).get("token_ids") for x in o))
    took = time.perf_counter() - start
    outs += _until(engine, lambda o: False)
    return took, [(o.data, o.finished) for o in outs if o.data is not None or o.finished]


def _talker(engine: Engine, rid: str, feed: list, params: dict,
            frames: int) -> tuple[float, list[dict]]:
    start = time.perf_counter()
    engine.add(EngineRequest(rid, {"stream": ["thinker"]}, params))
    for seq, (data, last) in enumerate(feed):
        engine.append(rid, "thinker", seq, data, last)

    def enough(outs: list) -> bool:  # "codes": one list per code group, one entry per frame
        return sum(len(o.data["codes"][0]) for o in outs
                   if (o.data or {}).get("codes")) >= frames
    outs = _until(engine, enough)
    took = time.perf_counter() - start
    _drain(engine, rid)
    return took, [o.data for o in outs if (o.data or {}).get("codes")]


def _code2wav(engine: Engine, rid: str, chunks: list[dict], params: dict) -> float:
    start = time.perf_counter()
    engine.add(EngineRequest(rid, {"stream": ["talker"]}, params))
    for seq, data in enumerate(chunks):  # the last one closes the input (a stage that
        engine.append(rid, "talker", seq, data, seq == len(chunks) - 1)  # decodes it whole)
    _until(engine, lambda outs: bool(outs))
    _sync(engine)
    took = time.perf_counter() - start
    _drain(engine, rid)
    return took


def critical_path(pipeline: PipelineConfig, dtype: str, messages: list,
                  thinker_params: dict, talker_params: dict, repeats: int = 5) -> dict[str, Any]:
    """Median seconds of each part and their sum (see the module doc)."""
    stages = {s.name: s for s in pipeline.stages}
    audio = pipeline.outputs["audio"][0]  # code2wav, token2wav
    thinker, talker, code2wav = (_engine(stages[n], dtype) for n in ("thinker", "talker", audio))
    whole = int({**stages["talker"].params, **talker_params}.get("max_tokens", 1))
    first = int(stages[audio].options.get("first_chunk_frames", whole))
    c2w_params = dict(stages[audio].params)
    parts: dict[str, list[float]] = {"thinker_ttft_s": [], "talker_first_chunk_s": [],
                                     "code2wav_first_chunk_s": []}
    try:
        for i in range(repeats + 1):
            t1, feed = _thinker(thinker, f"t{i}", messages,
                                {**stages["thinker"].params, **thinker_params})
            t2, chunks = _talker(talker, f"k{i}", feed,
                                 {**stages["talker"].params, **talker_params}, first)
            t3 = _code2wav(code2wav, f"c{i}", chunks, c2w_params)
            if i:  # the first round warms up
                for key, t in zip(parts, (t1, t2, t3), strict=True):
                    parts[key].append(t)
    finally:
        for engine in (thinker, talker, code2wav):
            engine.shutdown()
    out: dict[str, Any] = {k: statistics.median(v) for k, v in parts.items()}
    out["path_s"] = sum(out[k] for k in parts)
    out["samples"] = parts
    out["first_chunk_frames"] = first
    out["audio_stage"] = audio
    return out
