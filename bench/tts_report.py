"""The Markdown report of `python -m bench tts` (numbers from tts.json)."""

from __future__ import annotations

from typing import Any

TTFP_SLACK_MS = 20.0  # target: TTFP at c=1 <= the direct first sentence + 20 ms
C1_SLOWDOWN = 1.10  # target: at c=1, <= 10 % slower than the direct call


def _rows(results: dict[str, Any]) -> list[str]:
    rows = []
    for config, levels in results.items():
        for c, s in levels.items():
            rows.append(f"| {config} | {c} | {s['requests']} | {s['audio_s_per_s']} | "
                        f"{s['ttfp_p50_ms']} | {s['ttfp_p99_ms']} | {s['done_p50_ms']} | "
                        f"{s['stalled_requests']} | {s['stall_p99_ms']} |")
    return rows


def _verdicts(results: dict[str, Any]) -> list[str]:
    direct = results.get("direct", {})
    out = []
    for config in (c for c in results if c != "direct"):
        ours = results[config]
        if "1" in direct and "1" in ours:
            d, o = direct["1"], ours["1"]
            slow = o["done_p50_ms"] / d["done_p50_ms"]
            out.append(f"- {config}, c=1: request time {o['done_p50_ms']} ms vs direct "
                       f"{d['done_p50_ms']} ms ({(slow - 1) * 100:+.1f} %; target <= +10 %: "
                       f"{'met' if slow <= C1_SLOWDOWN else 'missed'}); TTFP "
                       f"{o['ttfp_p50_ms']} ms vs direct first sentence {d['ttfp_p50_ms']} ms "
                       f"+ {TTFP_SLACK_MS:g} ms: "
                       f"{'met' if o['ttfp_p50_ms'] <= d['ttfp_p50_ms'] + TTFP_SLACK_MS else 'missed'}")
        if "8" in direct and "8" in ours:
            d, o = direct["8"]["audio_s_per_s"], ours["8"]["audio_s_per_s"]
            out.append(f"- {config}, c=8: {o} vs direct {d} audio-s/s (target >= direct: "
                       f"{'met' if o >= d else 'missed'})")
    return out


def report(r: dict[str, Any]) -> str:
    hw = r["hardware"]
    return "\n".join([
        "# Text to speech: omni vs piper called directly", "",
        f"Command: `{r['command']}`  ",
        f"Machine: {hw['cpu_model']}, {hw['cores_usable']} cores, {hw['ram_gib']} GiB RAM, "
        f"Python {hw['python']}; load average at start {hw['loadavg_at_start']}", "",
        f"Input, every request: \"{r['text']}\" (five sentences). Output: WAV, 16-bit, "
        "22,050 Hz, on both sides (ours streamed with stream_format=audio).", "",
        "| side | concurrency | requests | audio-s/s | TTFP p50 (ms) | TTFP p99 (ms) | "
        "request time p50 (ms) | requests that stall | stall p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_rows(r["results"]), "",
        "Targets:", *_verdicts(r["results"]), "",
        "Method: at concurrency c, c requests start together and TTFP / request time count "
        "from that moment, so time spent queued behind other requests is included on both "
        "sides (the direct loop serves a burst one request after another). Throughput = "
        "audio seconds produced / wall time of the bursts. Stall: seconds a listener who "
        "starts playing at the first byte sits in silence before the rest arrives (ours "
        "interleaves requests sentence by sentence, earliest playback deadline first, so "
        "request time grows while the first byte comes early and playback stays ahead "
        "until the machine is over capacity). Every side runs onnxruntime with "
        "one intra-op thread, one inter-op thread, no spinning. fused-x2 runs two engine "
        "processes (two threads in all), so it is not a like-for-like row; it shows what a "
        "second replica buys on this machine. Ours includes HTTP, the orchestrator, the "
        "engine process hop and WAV framing; the client runs on the same machine.", ""])
