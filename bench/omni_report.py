"""Summaries and the Markdown report of `python -m bench omni`."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from bench.common import hardware, percentile

METRICS = (("ttft_s", "TTFT"), ("ttfp_s", "TTFP"), ("e2el_s", "E2EL"), ("rtf", "RTF"),
           ("underrun_s", "underrun"))


def machine() -> dict[str, Any]:
    info = hardware()
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpus"] = torch.cuda.device_count()
    except ImportError:
        pass
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    info["python"] = platform.python_version()
    return info


def _per_stage(transit: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per stage over the level: engine steps (count, mean s) and its last input's wait
    behind a running step (mean s per request, and the sum as a share of summed E2EL)."""
    stages = sorted({k.split(":", 1)[1] for k in transit if ":" in k})
    latency = transit.get("latency") or float("nan")
    out = {}
    for stage in stages:
        steps, waits = transit.get(f"step_count:{stage}", 0.0), transit.get(
            f"wait_count:{stage}", 0.0)
        out[stage] = {"steps": steps,
                      "step_mean_s": transit.get(f"step_sum:{stage}", 0.0) / (steps or float("nan")),
                      "wait_mean_s": transit.get(f"wait_sum:{stage}", 0.0) / (waits or float("nan")),
                      "wait_share": transit.get(f"wait_sum:{stage}", 0.0) / latency,
                      "preemptions": transit.get(f"preemptions:{stage}", 0.0),
                      # its process's garbage collections of 1 ms or more: total s, count
                      "gc_s": transit.get(f"gc_sum:{stage}", 0.0),
                      "gc_pauses": transit.get(f"gc_count:{stage}", 0.0),
                      # arrival to its first output, mean per request
                      "first_output_mean_s": transit.get(f"first_sum:{stage}", 0.0) / (
                          transit.get(f"first_count:{stage}", 0.0) or float("nan")),
                      # the hops of its last input and last output, mean per request
                      "hop_in_mean_s": transit.get(f"hop_in_sum:{stage}", 0.0) / (
                          waits or float("nan")),
                      "hop_out_mean_s": transit.get(f"hop_out_sum:{stage}", 0.0) / (
                          waits or float("nan"))}
    return out


def summarize(level: dict[str, Any]) -> dict[str, Any]:
    runs, transit = level["runs"], level["transit"]
    errors = [r["error"] for r in runs if "error" in r]
    out: dict[str, Any] = {"requests": len(runs), "failed": len(errors),
                           "first_error": errors[0] if errors else None}
    for key, _ in METRICS:
        values = sorted(r[key] for r in runs if r.get(key) is not None)
        out[key] = {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
                    "n": len(values)}
    out["audio_s"] = sum(r.get("audio_s", 0.0) for r in runs) / max(1, len(runs) - len(errors))
    out["stages"] = _per_stage(transit)
    for key in ("prompt_tokens", "completion_tokens"):
        out[key] = sorted({r[key] for r in runs if r.get(key) is not None})
    latency = transit.get("latency") or float("nan")
    for key in ("hop", "step_wait", "chain_hop", "chain_step_wait"):
        out[f"{key}_share"] = transit.get(key, 0.0) / latency
    # the server's own TTFP (request arrival to the first audio packet written), beside
    # the client's: the difference is the connection, HTTP and the client's parsing
    out["server_ttfp_mean"] = transit.get("server_ttfp", 0.0) / (transit.get("server_ttfp_n")
                                                                 or float("nan"))
    client = [r["ttfp_s"] for r in runs if r.get("ttfp_s") is not None]
    out["client_ttfp_mean"] = sum(client) / len(client) if client else float("nan")
    out["transit"] = transit
    out["per_request"] = [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                           if k not in ("prompt_tokens", "completion_tokens")} for r in runs]
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x * 1e3:.1f}"


def _table(results: dict[str, Any]) -> list[str]:
    head = ["side", "c", "requests", "failed"]
    for _, name in METRICS:
        unit = "" if name == "RTF" else " (ms)"
        head += [f"{name} p50{unit}", f"{name} p99{unit}"]
    head += ["audio (s)", "chain hops %", "chain step wait %", "all hops %",
             "all step wait %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for side, levels in results.items():
        for c, s in levels.items():
            cells = [side, c, str(s["requests"]), str(s.get("failed", 0))]
            for key, name in METRICS:
                fmt = (lambda v: f"{v:.3f}") if name == "RTF" else _ms
                cells += [fmt(s[key]["p50"]), fmt(s[key]["p99"])]
            cells += [f"{s['audio_s']:.2f}"] + [
                f"{100 * s[k + '_share']:.2f}"
                for k in ("chain_hop", "chain_step_wait", "hop", "step_wait")]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def targets(data: dict[str, Any]) -> list[str]:
    path = data["critical_path"]["path_s"]
    stream = data["results"].get("stream", {})
    out = []
    for c, bound, label in (("1", path + 0.020, "critical path + 20 ms"),
                            ("32", 1.2 * path, "1.2 x critical path")):
        if c in stream:
            ttfp = stream[c]["ttfp_s"]["p50"]
            out.append(f"- stream TTFP p50 at c={c}: {_ms(ttfp)} ms vs {label} = "
                       f"{_ms(bound)} ms: {'met' if ttfp <= bound else 'missed'}")
    for side, levels in data["results"].items():
        for c, s in levels.items():
            out.append(f"- {side} c={c}: TTFP mean at the client {_ms(s['client_ttfp_mean'])} ms, "
                       f"in the server (arrival to first audio packet written) "
                       f"{_ms(s['server_ttfp_mean'])} ms")
            if s.get("failed"):
                out.append(f"- {side} c={c}: {s['failed']} of {s['requests']} requests failed, "
                           f"first: {s['first_error']}")
            share = s["chain_hop_share"] + s["chain_step_wait_share"]
            out.append(f"- {side} c={c}: queues and hops on the last-output chain "
                       f"{100 * share:.2f} % of E2EL (hops {100 * s['chain_hop_share']:.2f} %, "
                       f"step wait {100 * s['chain_step_wait_share']:.2f} %; target <= 2 %: "
                       f"{'met' if share <= 0.02 else 'missed'})")
            if s.get("stages"):
                out.append(f"- {side} c={c}: arrival to each stage's first output, mean per "
                           "request: " + ", ".join(
                               f"{st} {_ms(v.get('first_output_mean_s'))} ms"
                               for st, v in s["stages"].items()))
                out.append(f"- {side} c={c}: per stage, engine step mean (steps) / last "
                           "input's wait behind a running step, mean per request (% of E2EL) "
                           "/ hops of its last input and last output, mean per request: "
                           + "; ".join(f"{st} {_ms(v['step_mean_s'])} ms ({v['steps']:.0f}) / "
                                       f"{_ms(v['wait_mean_s'])} ms ({100 * v['wait_share']:.2f} %)"
                                       f" / {_ms(v.get('hop_in_mean_s'))} and "
                                       f"{_ms(v.get('hop_out_mean_s'))} ms"
                                       + _preempted(v) for st, v in s["stages"].items()))
    return out


def _preempted(stage: dict[str, Any]) -> str:
    n, gc = stage.get("preemptions", 0.0), stage.get("gc_pauses", 0.0)
    return ((f", {n:.0f} sequences preempted for KV space" if n else "")
            + (f", {gc:.0f} GC pauses of {_ms(stage['gc_s'])} ms in all" if gc else ""))


# seconds of audio per talker frame: Qwen3-Omni 12.5 frames/s, Qwen2.5-Omni 50 codes/s
FRAME_S = {"qwen3_omni": 0.08, "qwen2_5_omni": 0.02}


def write_report(data: dict[str, Any], out_dir: Path, tag: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"omni-{tag}" if tag else "omni"
    (out_dir / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
    cp, m, st = data["critical_path"], data["machine"], data["settings"]
    family = st.get("family", "qwen3_omni")
    gpu = f", {m['gpus']} x {m['gpu']}" if m.get("gpu") else ""
    lines = [
        f"# Spoken answers: stream vs full delivery ({family} pipeline)", "",
        f"Command: `{data['command']}`  ",
        f"Machine: {m['cpu_model']}, {m['cores']} cores, {m['ram_gib']} GiB RAM{gpu}; "
        f"Python {m['python']}, torch {m.get('torch')}, transformers {m.get('transformers')}; "
        f"load average at start {m['loadavg_at_start']}  ",
        f"Model: `{data['model_dir']}`; device {st['device']}, dtype {st['dtype']}; prompt "
        f"{st['prompt_tokens']} tokens (with the chat template: "
        f"{_first(data, 'prompt_tokens')}), thinker {st['thinker_tokens']} tokens, talker "
        f"{st['talker_frames']} frames ({st['talker_frames'] * FRAME_S[family]:.2f} s of "
        "audio)", "",
        *_table(data["results"]), "",
        f"Critical path (each engine alone, median of {len(cp['samples']['thinker_ttft_s'])}): "
        f"thinker TTFT {_ms(cp['thinker_ttft_s'])} ms + talker to its first "
        f"{cp['first_chunk_frames']} frames {_ms(cp['talker_first_chunk_s'])} ms + "
        f"{cp.get('audio_stage', 'code2wav')} first chunk {_ms(cp['code2wav_first_chunk_s'])} ms = {_ms(cp['path_s'])} ms", "",
        "Targets:", *targets(data), "",
        "Method: " + " ".join(_method_lines()), "",
    ]
    (out_dir / f"{name}.md").write_text("\n".join(lines))


def _first(data: dict[str, Any], key: str) -> str:
    for levels in data["results"].values():
        for s in levels.values():
            return ", ".join(str(v) for v in s[key])
    return "-"


def _method_lines() -> list[str]:
    from bench.omni import DESCRIPTION

    return [line.strip() for line in DESCRIPTION.splitlines() if line.strip()]
