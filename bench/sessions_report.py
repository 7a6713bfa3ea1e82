"""bench sessions: the Markdown report (sessions.md)."""

from __future__ import annotations

import os
import statistics
from typing import Any


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def report(r: dict[str, Any], description: str) -> str:
    hw = r["hardware"]
    lines = ["# Sessions: realtime turns, many sessions, voice turns", "",
             f"Command: `{r['command']}`  ",
             f"Machine: {hw['cpu_model']}, {hw['cores']} cores, Python {hw['python']}, "
             f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", "",
             description.split("\n\n", 1)[1].strip(), ""]
    if "history" in r:
        lines += _history(r["history"])
    if "many" in r:
        lines += _many(r["many"])
    if "voice" in r:
        lines += _voice(r["voice"])
    return "\n".join(lines)


def _history(h: dict[str, Any]) -> list[str]:
    rows = h["rows"]
    session, plain = _ms([x["session_ttft_s"] for x in rows]), _ms([x["plain_ttft_s"]
                                                                   for x in rows])
    speedup = plain / session if session else float("nan")
    lines = ["## history: the 9th turn of a session vs a plain request (SmolLM2)", "",
             "| round | prompt tokens | cached (session) | session TTFT ms | plain TTFT ms |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {i + 1} | {x['prompt_tokens']} | {x['cached_tokens']} | "
              f"{x['session_ttft_s'] * 1000:.0f} | {x['plain_ttft_s'] * 1000:.0f} |"
              for i, x in enumerate(rows)]
    lines += ["", f"Median: session {session} ms, plain {plain} ms: **{speedup:.1f}x** "
              f"(target >= 3x: {'met' if speedup >= 3 else '**missed**'}).", ""]
    return lines


def _many(m: dict[str, Any]) -> list[str]:
    metrics, n = m["metrics"], m["sessions"]
    kv = metrics.get("omni_session_state_bytes", 0)
    rss = m["rss_idle"] - m["rss_before"]
    return ["## many: concurrent sessions on one replica (tiny Qwen3)", "",
            "| sessions | served (2 turns each) | wall s | KV per idle session | "
            "RSS per idle session | state budget | evictions |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {n} | {m['served']} | {m['elapsed_s']:.1f} | {kv / n / 1024:.1f} KiB | "
            f"{rss / n / 1024:.0f} KiB | "
            f"{metrics.get('omni_session_state_budget_bytes', 0) / 2**20:.0f} MiB | "
            f"{metrics.get('omni_session_evictions_total', 0):.0f} |", "",
            "KV per idle session: the engines' report (`omni_session_state_bytes` / "
            "sessions). RSS: the server's process tree with the sessions idle minus before "
            "they opened (includes the prefix cache, allocator growth and the sockets).", ""]


def _voice(v: dict[str, Any]) -> list[str]:
    from bench.sessions_voice import voice_summary

    m = voice_summary(v)
    got, path = m["first_audio"], m["path"]
    lines = ["## voice: end of speech -> first audio byte (the default assistant, server VAD)",
             "", "The session, each event's arrival after the last speech chunk was sent "
             "(p50 ms):", "", "| speech_stopped | transcript | response.created | "
             "first transcript delta | **first audio** |", "|---:|---:|---:|---:|---:|",
             f"| {m['speech_stopped']} | {m['transcript']} | {m['response_created']} | "
             f"{m['first_text']} | **{got}** |", "",
             "Its critical path, each stage alone (p50 ms):", "",
             "| VAD silence window | whisper on the question | smollm2 to the end of its first "
             "sentence (answering the session's transcript) | piper's first audio of it | "
             "**sum** |", "|---:|---:|---:|---:|---:|",
             f"| {v['silence_window_ms']} | {m['whisper_s']} | {m['llm_sentence_s']} | "
             f"{m['piper_s']} | **{path}** |", "",
             f"Session - path: {got - path:+.1f} ms (target <= +50 ms: "
             f"{'met' if got <= path + 50 else '**missed**'}).", "", "| round | heard | said "
             "(first sentence) | first audio ms |", "|---:|---|---|---:|"]
    lines += [f"| {i + 1} | {r['heard']} | {r['sentence']} | "
              f"{r['after_speech_s'].get('first_audio', float('nan')) * 1000:.0f} |"
              for i, r in enumerate(v["rows"])]
    return lines + [""]
