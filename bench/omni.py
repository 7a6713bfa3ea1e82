"""Spoken answers: stream vs full delivery on the Qwen3-Omni pipeline, in one run.

DESCRIPTION is the --help text; the report (omni.md) repeats the method.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import free_device_memory, say, sse_events

DESCRIPTION = """\
Time to first text (TTFT), time to first audio packet (TTFP), real-time factor (RTF),
end-to-end latency (E2EL) and audio underrun of spoken answers from the qwen3_omni preset
(thinker -> talker -> code2wav; --family qwen2_5_omni: thinker -> talker -> token2wav,
whose token2wav decodes chunks of codes as they stream in, or the whole utterance on the
full side) served over HTTP, for two sides started from the same preset and model directory:

  stream  both edges `delivery: stream` (the preset): the talker starts on the first
          thinker tokens, code2wav on the first codec frames
  full    both edges `delivery: full`: each stage starts when the one before has finished
  stream-nice0, full-nice0   the same without the preset's stage priorities (`nice`: the
          thinker yields the CPU to the talker and code2wav), to measure what they buy
  SIDE+STAGE.OPTION=VALUE    any side with a stage option changed (repeatable, VALUE read
          as YAML), to measure a setting side by side with the preset's, e.g.
          --sides stream,stream+code2wav.max_batch_frames=128; an edge's option the
          same way, named SRC->DST: stream+thinker->talker.max_lead=8 (quote it); a
          stage's devices or memory too: stream+talker.devices=cuda:1+code2wav.devices=cuda:1
          puts the talker and code2wav on a second GPU

Requests: streaming chat completions (openai's wire format) with modalities [text, audio],
pcm16; a fixed-length prompt per request (distinct text per request), the thinker's and
the talker's lengths fixed by ignoring their end tokens. At concurrency c, c requests
start together and every time counts from that moment. Bursts alternate between the
sides (one of each, then the other way round). RTF = time to the last audio packet /
seconds of audio. Underrun: the worst deficit of a player that starts at the first packet
and plays on.
Queues and hops (omni/wire/transit.py, from the timestamps every message carries): time in
sockets, decoding and event loops (hop) and behind an engine step already running (step
wait) of the messages on each request's last-output chain (per stage: its last input and
its last output), and of all its messages (these overlap with compute, so they overstate
the cost); summed over the level's requests from /metrics, divided by the summed E2EL.
Critical path (stream target): thinker TTFT + the talker's time to its first chunk +
code2wav's time for that chunk, each measured on its own engine in this process
(bench/omni_engines.py).
"""

SIDES = ("stream", "full")
STAGE_FIELDS = {"devices", "memory"}  # side changes of these set the stage, not an option
NICE0 = "-nice0"  # side-name suffix: every stage at the default CPU priority
PCM_RATE = 24_000
VOICES = {"qwen3_omni": "ethan", "qwen2_5_omni": "Chelsie"}  # family -> a voice it has
FILLER = ("river stone light window garden music paper winter orange table yellow "
          "mountain quiet simple morning").split()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--family", default="qwen3_omni", choices=sorted(VOICES),
                        help="the preset (and tiny fixture) measured (default qwen3_omni)")
    parser.add_argument("--model-dir", default=None,
                        help="a release directory of the family (default: the tiny random "
                             "fixture, built on first use)")
    parser.add_argument("--concurrency", default="1,8,32",
                        help="comma-separated concurrencies (default 1,8,32)")
    parser.add_argument("--bursts", default="10,2,1",
                        help="bursts per concurrency and side, same order (default 10,2,1)")
    parser.add_argument("--prompt-tokens", type=int, default=64,
                        help="user prompt length in tokens (default 64)")
    parser.add_argument("--thinker-tokens", type=int, default=32,
                        help="thinker tokens per answer, end token ignored (default 32)")
    parser.add_argument("--talker-frames", type=int, default=48,
                        help="codec frames per answer (80 ms each), end ignored (default 48)")
    parser.add_argument("--device", default="auto", help="device of every stage (default auto)")
    parser.add_argument("--dtype", default="auto", help="engine dtype (default auto)")
    parser.add_argument("--memory", default="",
                        help="per-stage memory budgets, e.g. thinker=30GiB,talker=12GiB "
                             "(default: the preset's GPU shares, divided among the sides, "
                             "whose servers share the GPU)")
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="default stream,full; empty: the critical path only")
    parser.add_argument("--repeats", type=int, default=5,
                        help="critical-path rounds per part (default 5)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds to wait for a server to start (default 600)")
    parser.add_argument("--start-together", action="store_true",
                        help="start the sides' servers at once (faster; by default one after "
                             "another, so no server's load-time measurements, such as its AR "
                             "stages' step-time model, are taken while another loads)")
    parser.add_argument("--tag", default="", help="suffix of the report names: omni-TAG.md")
    parser.add_argument("--out", default="bench/results",
                        help="directory for omni.md and omni.json (default bench/results)")


# -- setup ------------------------------------------------------------------------------
def model_dir(args: argparse.Namespace) -> str:
    if args.model_dir:
        return str(Path(args.model_dir).resolve())
    from omni.fixtures import ensure_tiny_model

    return str(ensure_tiny_model(args.family))


def side_settings(side: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """A side's base name (stream, full, ...-nice0) and its stage-option changes."""
    import yaml

    base, *changes = side.split("+")
    if base.removesuffix(NICE0) not in SIDES:
        raise SystemExit(f"bench omni: side {side!r} must start with stream or full")
    options: dict[str, dict[str, Any]] = {}
    for change in changes:
        key, eq, value = change.partition("=")
        stage, dot, option = key.partition(".")
        if not (eq and dot and stage and option):
            raise SystemExit(f"bench omni: {change!r} in side {side!r} is not STAGE.OPTION=VALUE or SRC->DST.OPTION=VALUE")
        options.setdefault(stage, {})[option] = yaml.safe_load(value)
    return base, options


def file_safe(side: str) -> str:
    """A side's name in file names (the GPU box returns plain names only)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", side)


def pipeline_file(directory: str, side: str, args: argparse.Namespace, tmp: Path) -> Path:
    """The family's preset pointed at `directory`, with this side's delivery and option
    changes, fixed lengths, and the device and budgets asked for."""
    import yaml

    from omni.config.presets import preset_path

    base, changes = side_settings(side)
    family = getattr(args, "family", "qwen3_omni")  # callers that predate --family
    data = yaml.safe_load(Path(preset_path(family)).read_text())
    edges = {f"{e['from']}->{e['to']}": e for e in data["edges"]}
    unknown = set(changes) - {stage["name"] for stage in data["stages"]} - set(edges)
    if unknown:
        raise SystemExit(f"bench omni: side {side!r} changes unknown stage(s) {sorted(unknown)}")
    budgets = dict(kv.split("=", 1) for kv in args.memory.split(",") if kv)
    fixed = {"thinker": {"max_tokens": args.thinker_tokens, "ignore_eos": True},
             "talker": {"max_tokens": args.talker_frames, "ignore_eos": True}}
    for stage in data["stages"]:
        stage.update(model_dir=directory, devices=[args.device])
        if stage["name"] in budgets:
            stage["memory"] = budgets[stage["name"]]
        elif str(stage.get("memory", "")).endswith("%"):  # both servers on one GPU
            share = float(str(stage["memory"])[:-1]) / max(1, len(args.sides.split(",")))
            stage["memory"] = f"{share:g}%"
        stage.setdefault("params", {}).update(fixed.get(stage["name"], {}))
        change = dict(changes.get(stage["name"], {}))
        stage.update({key: change.pop(key) for key in STAGE_FIELDS & set(change)})
        stage.setdefault("options", {}).update(change)
    for name, edge in edges.items():
        edge["delivery"] = base.removesuffix(NICE0)
        if edge["delivery"] == "full":
            edge.pop("max_lead", None)  # a lead is kept on stream edges only
        edge.update(changes.get(name, {}))
    if base.endswith(NICE0):
        for stage in data["stages"]:
            stage.get("options", {}).pop("nice", None)
    data["max_inflight"] = 256
    path = tmp / f"omni-{file_safe(side)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def prompts(directory: str, n_tokens: int, count: int) -> list[str]:
    """`count` distinct user prompts of `n_tokens` tokens each (by the model's tokenizer)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(directory)
    out = []
    for i in range(count):
        words = [f"Question {i}:"] + [FILLER[(i + j) % len(FILLER)] for j in range(n_tokens)]
        ids = tok(" ".join(words), add_special_tokens=False)["input_ids"][:n_tokens]
        out.append(tok.decode(ids))
    return out


# -- one request ------------------------------------------------------------------------
async def spoken_answer(session: Any, url: str, model: str, prompt: str, seed: int,
                        start: float, voice: str = "ethan") -> dict[str, Any]:
    from omni.media.playback import PlaybackClock

    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "modalities": ["text", "audio"], "audio": {"voice": voice, "format": "pcm16"},
            "stream": True, "stream_options": {"include_usage": True}, "seed": seed}
    clock, usage, worst_at, second = PlaybackClock(start=start), None, None, None
    try:
        async for now, event in sse_events(session, f"{url}/v1/chat/completions", body,
                                           time.monotonic):
            usage = event.get("usage") or usage
            for choice in event.get("choices") or ():
                audio = (choice.get("delta") or {}).get("audio") or {}
                if audio.get("transcript"):
                    clock.text(now)
                if audio.get("data"):
                    worst = clock.underrun_s
                    if clock.first_audio is not None and second is None:
                        second = now - start
                    clock.audio(len(base64.b64decode(audio["data"])) / 2 / PCM_RATE, now)
                    worst_at = now - start if clock.underrun_s > worst else worst_at
    except RuntimeError as exc:  # a failed request is counted and reported, and the run
        # goes on: one error must not lose the other requests' numbers
        return {"error": str(exc)[:500]}
    summary = clock.summary()
    # where the worst deficit was met, and the second packet: a stall after the first
    # packet shows in them (the report keeps every request's numbers in its JSON)
    summary.update(audio_s=clock.audio_s, prompt_tokens=(usage or {}).get("prompt_tokens"),
                   completion_tokens=(usage or {}).get("completion_tokens"),
                   underrun_at_s=worst_at, second_packet_s=second)
    return summary


async def scrape(session: Any, url: str) -> dict[str, float]:
    """Summed per-request seconds on /metrics (omni/wire/transit.py: hops and step waits over
    all messages and over the last-output chain; latency) and the request count."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out = {}
    for key, metric, messages in (("hop", "omni_request_hop_seconds_sum", "all"),
                                  ("chain_hop", "omni_request_hop_seconds_sum", "chain"),
                                  ("step_wait", "omni_request_step_wait_seconds_sum", "all"),
                                  ("chain_step_wait", "omni_request_step_wait_seconds_sum",
                                   "chain"),
                                  ("latency", "omni_request_latency_seconds_sum", None),
                                  ("server_ttfp", "omni_ttfp_seconds_sum", None),
                                  ("server_ttfp_n", "omni_ttfp_seconds_count", None),
                                  ("requests", "omni_request_latency_seconds_count", None)):
        label = f'[^}}]*messages="{messages}"[^}}]*' if messages else "[^}]*"
        found = re.search(rf"^{metric}{{{label}}} ([0-9.e+-]+)$", text, re.M)
        out[key] = float(found.group(1)) if found else 0.0
    # per stage: its engine's step durations, and how long each request's last input to it
    # waited behind a running step (keys "step_sum:<stage>", ...)
    for key, metric in (("step_sum", "omni_engine_step_seconds_sum"),
                        ("step_count", "omni_engine_step_seconds_count"),
                        ("wait_sum", "omni_stage_step_wait_seconds_sum"),
                        ("wait_count", "omni_stage_step_wait_seconds_count"),
                        ("preemptions", "omni_replica_preemptions"),
                        ("gc_sum", "omni_engine_gc_pause_seconds_sum"),
                        ("gc_count", "omni_engine_gc_pause_seconds_count"),
                        ("first_sum", "omni_stage_first_output_seconds_sum"),
                        ("first_count", "omni_stage_first_output_seconds_count")):
        for found in re.finditer(rf'^{metric}{{[^}}]*stage="([^"]+)"[^}}]*}} ([0-9.e+-]+)$',
                                 text, re.M):
            out[f"{key}:{found.group(1)}"] = float(found.group(2))
    # per stage: the hops of its last input and last output ("hop_in_sum:<stage>", ...)
    for found in re.finditer(r'^omni_stage_hop_seconds_sum{([^}]*)} ([0-9.e+-]+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        out[f"hop_{labels.get('direction')}_sum:{labels.get('stage')}"] = float(found.group(2))
    return out


# -- the run ----------------------------------------------------------------------------
async def _measure(urls: dict[str, str], texts: list[str], levels: list[tuple[int, int]],
                   level_done: Any, voice: str) -> dict[str, Any]:
    import aiohttp

    from bench.ar_ours import served_id
    from bench.omni_report import summarize

    connector = aiohttp.TCPConnector(limit=max(c for c, _ in levels) * 2 + 8)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=3600)) as session:
        models = {side: await served_id(session, url) for side, url in urls.items()}
        used = 0

        async def burst(side: str, c: int) -> list[dict[str, Any]]:
            nonlocal used
            start, batch = time.monotonic(), texts[used % len(texts):][:c]
            used += c
            return list(await asyncio.gather(*(
                spoken_answer(session, urls[side], models[side], t, i, start, voice)
                for i, t in enumerate(batch))))

        for _ in range(2):  # warm-up: first-use costs (compiles, allocator growth) off the
            # clock; the sides at once, since only their first uses matter here
            await asyncio.gather(*(burst(side, 1) for side in urls))
        out: dict[str, Any] = {side: {} for side in urls}
        for c, bursts in levels:
            runs: dict[str, list] = {side: [] for side in urls}
            hops: dict[str, dict[str, float]] = {}
            for side in urls:
                hops[side] = {k: -v for k, v in (await scrape(session, urls[side])).items()}
            for b in range(bursts):
                # every other burst in the reverse order: with an even count, no side
                # always goes first (the first side of a pair measured slower TTFTs)
                for side in list(urls)[::1 if b % 2 == 0 else -1]:
                    runs[side] += await burst(side, c)
                failed = [r["error"] for r in runs[side] if "error" in r]
                say(f"[omni] c={c}: burst {b + 1}/{bursts} done" + (
                    f"; {len(failed)} failed, first: {failed[0]}" if failed else ""))
            for side in urls:
                after = await scrape(session, urls[side])
                delta = {k: hops[side].get(k, 0.0) + after[k] for k in after}
                out[side][str(c)] = {"runs": runs[side], "transit": delta}
                level = summarize(out[side][str(c)])  # the report's numbers
                say(f"[omni] {side} c={c}: p50 " + ", ".join(
                    f"{k[:-2].upper()} {level[k]['p50'] * 1e3:.0f} ms"
                    for k in ("ttft_s", "ttfp_s", "e2el_s"))
                    + (f"; {level['failed']} failed" if level["failed"] else ""))
            level_done(out)  # a run cut short still leaves every level it finished
    return out


def _start_servers(sides: list[str], files: dict[str, Path], args: argparse.Namespace,
                   procs: list[Any]) -> dict[str, str]:
    """Every side's server, one after another unless --start-together; each one's log
    goes to server-<side>[-tag].log next to the report. Why one after another: a server
    times prefill steps at load to size its step budget, and two servers loading on one
    GPU disturbed that (Qwen2.5-Omni on an H100: one server's thinker fitted 56.7 ms of
    fixed cost, the other's 3.1 ms; bench/results/omni-qwen2_5_omni-h100.md), so the sides
    ran with different budgets."""
    from concurrent.futures import ThreadPoolExecutor

    from bench.ar_ours import start_server

    started = time.monotonic()
    say(f"[omni] starting the servers ({', '.join(sides)}) ...")

    def start(side: str) -> str:
        log = Path(args.out) / f"server-{file_safe(side)}{'-' + args.tag if args.tag else ''}.log"
        proc, url = start_server(("--pipeline", str(files[side])), args.dtype, args.timeout,
                                 log_path=log)
        procs.append(proc)
        say(f"[omni] {side} server up in {time.monotonic() - started:.1f} s (log: {log})")
        return url

    workers = len(sides) if args.start_together else 1
    with ThreadPoolExecutor(workers or 1) as pool:
        return dict(zip(sides, pool.map(start, sides), strict=True))


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from bench.omni_engines import critical_path
    from bench.omni_report import machine, summarize, write_report
    from omni.config.presets import load_pipeline

    directory = model_dir(args)
    levels = list(zip((int(c) for c in args.concurrency.split(",")),
                      (int(b) for b in args.bursts.split(",")), strict=True))
    sides = [s for s in args.sides.split(",") if s]
    texts = prompts(directory, args.prompt_tokens, 4 * sum(c * (b + 1) for c, b in levels))
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        files = {side: pipeline_file(directory, side, args, Path(tmp))
                 for side in sides or ["stream"]}
        say("[omni] critical path: each stage's engine in this process ...")
        path = critical_path(load_pipeline(next(iter(files.values()))), args.dtype,
                             [{"role": "user", "content": texts[0]}],
                             {"seed": 0}, {"seed": 0}, args.repeats)
        say("[omni] critical path " + ", ".join(
            f"{k} {v * 1e3:.1f} ms" for k, v in path.items() if k.endswith("_s")))
        free_device_memory()
        data = {"command": "python -m bench " + " ".join(argv), "machine": machine(),
                "model_dir": directory, "settings": vars(args), "critical_path": path,
                "results": {}}

        def level_done(raw: dict[str, Any]) -> None:
            data["results"] = {side: {c: summarize(level) for c, level in per.items()}
                               for side, per in raw.items()}
            write_report(data, Path(args.out), args.tag)

        level_done({})
        try:
            urls = _start_servers(sides, files, args, procs)
            if sides:
                asyncio.run(_measure(urls, texts, levels, level_done, VOICES[args.family]))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(120)
    return 0
