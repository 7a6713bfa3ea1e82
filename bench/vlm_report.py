"""The Markdown report of `python -m bench vlm` (the JSON beside it holds every number)."""

from __future__ import annotations

from typing import Any

VL_COLUMNS = (("requests", "requests"), ("tokens", "tokens"), ("wall_s", "wall s"),
              ("tokens_per_s", "tokens/s"), ("ttft_p50_ms", "TTFT p50 ms"),
              ("itl_p50_ms", "ITL p50 ms"), ("short_requests", "short answers"))
WHISPER_COLUMNS = (("requests", "clips"), ("audio_s", "audio s"), ("wall_s", "wall s"),
                   ("rtf", "RTF"), ("audio_s_per_s", "audio s/s"),
                   ("latency_p50_s", "latency p50 s"), ("tokens", "tokens"),
                   ("short_requests", "short answers"))
# ours-inproc's own details: the encoder's batches, the engine vs the runner per clip
VL_DETAILS = (("encoder_batches", "encoder batches"), ("encode_batched_s", "encode, one batch s"),
              ("encode_one_by_one_s", "encode, one by one s"))
# ours-http's, from the server's /metrics around the measured burst: how it batched
HTTP_DETAILS = (("encoder_batches", "encoder batches"), ("encoder_prompts", "media prompts"),
                ("encoder_s", "encoder busy s"))
WHISPER_DETAILS = (("calls", "generate calls"), ("one_by_one_s", "runner one by one s"),
                   ("rtf_one_by_one", "RTF one by one"))


def _cell(value: Any) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _table(result: dict[str, Any], columns: tuple[tuple[str, str], ...],
           sides: list[str]) -> list[str]:
    lines = ["| side | c | " + " | ".join(title for _, title in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for side in sides:
        rows = result["results"].get(side) or {}
        if "skipped" in rows or "error" in rows:
            lines.append(f"| {side} | | {rows.get('skipped') or rows.get('error')} |")
            continue
        for level, row in rows.items():
            lines.append(f"| {side} | {level} | "
                         + " | ".join(_cell(row.get(k)) for k, _ in columns) + " |")
    return lines


def markdown(result: dict[str, Any], description: str) -> str:
    whisper = result["family"] == "whisper_hf"
    s, hw = result["settings"], result["hardware"]
    release = f" ({result['release']}'s shapes, random weights)" if result["release"] else ""
    gpu = f", {hw['gpu']}" if hw.get("gpu") else ""
    lines = [f"# bench vlm: {result['family']}{release} on {s['device']}", "",
             f"Command: `{result['command']}`  ",
             f"Commit: {result['commit']}  ",
             f"Model: {result['model_dir']} (shape {result['shape']}"
             + (f", {s['layers']} text layers" if s["layers"] else "") + ")  ",
             f"Machine: {hw['cpu_model']}, {hw['cores']} cores{gpu}; torch {hw.get('torch')}, "
             f"transformers {hw.get('transformers')}, Python {hw['python']}  ",
             f"Per request: {s['new_tokens']} new tokens, "
             + (f"{s['clip_seconds']} s clips" if whisper else f"{s['image_size']} px images")
             + (f"; hf-generate's processor: {s['hf_processor']}" if s.get("hf_processor")
                else ""), ""]
    sides = list(result["results"])
    lines += _table(result, WHISPER_COLUMNS if whisper else VL_COLUMNS, sides)
    if isinstance(result["results"].get("ours-inproc"), dict) and \
            "error" not in result["results"]["ours-inproc"]:
        lines += ["", "ours-inproc's details:", ""]
        lines += _table(result, WHISPER_DETAILS if whisper else VL_DETAILS, ["ours-inproc"])
    http = result["results"].get("ours-http")
    if not whisper and isinstance(http, dict) and any(
            isinstance(row, dict) and "encoder_batches" in row for row in http.values()):
        lines += ["", "ours-http's media encoder during each measured burst (/metrics):", ""]
        lines += _table(result, HTTP_DETAILS, ["ours-http"])
    lines += ["", "## Method", "", description.split("\n\n", 1)[1].strip(), ""]
    return "\n".join(lines)
