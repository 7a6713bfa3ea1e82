"""diffusion.md / diffusion.json: the benchmark's numbers and what they mean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(result: dict[str, Any], out: Path, tag: str | None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = "diffusion" + (f"-{tag}" if tag else "")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    path = out / f"{stem}.md"
    path.write_text(render(result))
    return path


def render(r: dict[str, Any]) -> str:
    micro = r["transformer_s"]
    lines = [f"# Diffusion serving: {r['shape']}, {r['size']}, {r['steps']} steps",
             "", f"Command: `{r['command']}`  ", f"Device: {r['device']}  ",
             f"Commit: {r.get('commit') or 'unknown'}  ",
             f"When: {r['when']}; {r['per_client']} requests per client (closed loop).", ""]
    if micro:
        lines += ["## Bare transformer (one call, random inputs of the same shapes)", "",
                  "| batch | ms/call | steps/s (= batch / call) | vs batch 1 |", "|---|---|---|---|"]
        one = micro.get("1")
        for batch, seconds in micro.items():
            rate = int(batch) / seconds
            ratio = f"{rate * one:.2f}x" if one else ""
            lines.append(f"| {batch} | {seconds * 1000:.1f} | {rate:.2f} | {ratio} |")
        lines.append("")
    lines += _fp8_micro(micro, r.get("transformer_fp8_s") or {})
    lines += ["## Serving", "",
              "| side | c | steps/s | images/s | p50 s | p99 s | mean s | p99/mean | "
              "transformer calls | rows run | max rows/call | skipped steps | "
              "image encode p50 s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(
            f"| {row['side']} | {row['concurrency']} | {row['steps_per_s']:.2f} | "
            f"{row['images_per_s']:.3f} | {row['p50_s']:.2f} | {row['p99_s']:.2f} | "
            f"{row['mean_s']:.2f} | {row['p99_over_mean']:.2f} | "
            f"{row.get('transformer_calls', '')} | {row.get('rows_run', '')} | "
            f"{row.get('max_rows', '')} | "
            f"{row.get('skipped_steps', '')} | {row.get('encode_p50_s', '')} |")
    lines += ["", *_checks(r), ""]
    return "\n".join(lines)


def _checks(r: dict[str, Any]) -> list[str]:
    """The issue's targets, computed from this run only."""
    out = ["## Targets (from this run)", ""]
    rows = {(x["side"], x["concurrency"]): x for x in r["rows"]}
    micro8 = r["transformer_s"].get("8")
    ours8 = rows.get(("ours-engine", 8))
    if micro8 and ours8:
        ceiling = 8 / micro8
        out.append(f"- c=8 steps/s: ours-engine {ours8['steps_per_s']:.2f} vs bare transformer "
                   f"at batch 8 {ceiling:.2f} = {ours8['steps_per_s'] / ceiling:.0%} "
                   "(target >= 90%)")
    if ours8:
        out.append(f"- starvation at c=8: p99 / mean latency = {ours8['p99_over_mean']:.2f} "
                   "(target <= 1.25)")
    for c in (1, 8):
        plain, cached = rows.get(("ours-engine", c)), rows.get(("ours-cache", c))
        if plain and cached and cached.get("transformer_calls"):
            out.append(
                f"- step cache at its default threshold, c={c}: transformer calls "
                f"{plain['transformer_calls']} -> {cached['transformer_calls']} "
                f"({plain['transformer_calls'] / cached['transformer_calls']:.2f}x fewer), "
                f"rows {plain['rows_run']} -> {cached['rows_run']} "
                f"({plain['rows_run'] / cached['rows_run']:.2f}x; target >= 1.5x). A call "
                "runs while any job in it needs one, so with requests at different steps "
                "rows fall more than calls. Random weights say nothing about the quality "
                "cost.")
    for (side, c), fp8 in rows.items():
        plain = rows.get(("ours-engine", c))
        if side == "ours-fp8" and plain:
            out.append(f"- fp8 blocks vs the model's dtype, c={c}: {fp8['steps_per_s']:.2f} vs "
                       f"{plain['steps_per_s']:.2f} steps/s "
                       f"({fp8['steps_per_s'] / plain['steps_per_s']:.2f}x)")
    seq = rows.get(("diffusers-seq", 8))
    if seq and ours8:
        out.append(f"- c=8 vs diffusers one request at a time: {ours8['steps_per_s']:.2f} vs "
                   f"{seq['steps_per_s']:.2f} steps/s "
                   f"({ours8['steps_per_s'] / seq['steps_per_s']:.2f}x)")
    return out


def _fp8_micro(plain: dict[str, float], fp8: dict[str, float]) -> list[str]:
    """The bare transformer with fp8 blocks beside the model's dtype (side ours-fp8)."""
    if not fp8:
        return []
    lines = ["## Bare transformer, blocks in fp8 e4m3 (quantization: fp8)", "",
             "| batch | ms/call fp8 | ms/call model dtype | speed-up |", "|---|---|---|---|"]
    for batch, seconds in fp8.items():
        base = plain.get(batch)
        lines.append(f"| {batch} | {seconds * 1000:.1f} | "
                     f"{base * 1000:.1f} | {base / seconds:.2f}x |" if base else
                     f"| {batch} | {seconds * 1000:.1f} | | |")
    return [*lines, ""]
