"""Summaries, the decode roofline and the Markdown report of `python -m bench ar`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.common import percentile

TTFT_SLACK = 0.05  # target: HTTP TTFT within 5 % of the engine called in-process
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


def summarize(runs: list[dict[str, Any]], wall: float, new_tokens: int) -> dict[str, Any]:
    def ms(key: str, q: float) -> float | None:
        values = sorted(r[key] * 1000 for r in runs if r.get(key) is not None)
        return round(percentile(values, q), 3) if values else None

    tokens = sum(r["tokens"] for r in runs)
    gaps = sorted(g * 1000 for r in runs for g in r["gaps"])
    out = {"requests": len(runs), "tokens": tokens, "wall_s": round(wall, 3),
           "tokens_per_s": round(tokens / wall, 1),
           "ttft_p50_ms": ms("ttft", 0.5), "ttft_p99_ms": ms("ttft", 0.99),
           "itl_p50_ms": ms("itl", 0.5), "itl_p99_ms": ms("itl", 0.99),
           "step_p50_ms": round(percentile(gaps, 0.5), 3) if gaps else None,
           "done_p50_ms": ms("done", 0.5), "ttft_max_ms": ms("ttft", 1.0),
           # every request's, in burst order: an outlier's burst and place show here
           "ttft_all_ms": [round(r["ttft"] * 1000, 1) for r in runs],
           "short_requests": sum(1 for r in runs if r["tokens"] != new_tokens)}
    if any("ttft_text" in r for r in runs):
        out["ttft_text_p50_ms"] = ms("ttft_text", 0.5)
        out["text_chunks_per_token"] = round(sum(r["text_chunks"] for r in runs) / tokens, 3)
    return out


def brief(s: dict[str, Any]) -> str:
    return (f"{s['tokens_per_s']} tok/s, TTFT p50 {s['ttft_p50_ms']} ms, ITL p50 "
            f"{s['itl_p50_ms']} ms ({s['requests']} requests)")


def environment(device: str) -> dict[str, Any]:
    import torch
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__}
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(torch.device(device))
        env["gpu_memory_gib"] = round(
            torch.cuda.get_device_properties(torch.device(device)).total_memory / 2**30, 1)
    return env


def model_summary(config: dict[str, Any]) -> dict[str, Any]:
    """Shapes and parameter counts of a decoder-only config.json (Qwen3 dense / MoE), or
    of the text decoder nested in a multimodal one (its text_config)."""
    c = _decoder_config(config) or config
    hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    step = c.get("decoder_sparse_step") or 1
    moe_layers = sum(1 for i in range(layers) if experts and (i + 1) % step == 0
                     and i not in (c.get("mlp_only_layers") or ()))
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 2 * head_dim \
        + 2 * hidden  # q, o, k, v; q/k norms; the two layer norms
    expert = 3 * hidden * (c.get("moe_intermediate_size") or 0)
    tied = bool(c.get("tie_word_embeddings"))
    out = {"model_type": config.get("model_type"), "layers": layers, "hidden": hidden,
           "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "vocab": vocab,
           "intermediate": c.get("intermediate_size"), "tied_embeddings": tied,
           "experts": experts, "experts_per_token": c.get("num_experts_per_tok") or 0,
           "moe_intermediate": c.get("moe_intermediate_size"), "moe_layers": moe_layers,
           # per-layer / per-expert parameter counts used by the roofline
           "_attn": attn, "_dense_mlp": 3 * hidden * (c.get("intermediate_size") or 0),
           "_expert": expert, "_router": hidden * experts}
    body = layers * attn + (layers - moe_layers) * out["_dense_mlp"] \
        + moe_layers * (out["_router"] + experts * expert) + hidden
    active = body - moe_layers * (experts - out["experts_per_token"]) * expert
    out["params"] = body + vocab * hidden * (1 if tied else 2)
    out["active_params"] = active + vocab * hidden * (1 if tied else 2)
    return out


def _decoder_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config of the text decoder: the top level, or for a multimodal release the
    nested decoder config (text_config, possibly inside another *_config) with the largest
    vocabulary: a speech decoder nested beside it has a codebook, far smaller."""
    found = []

    def walk(c: dict[str, Any]) -> None:
        if all(k in c for k in ("hidden_size", "num_hidden_layers", "vocab_size")):
            found.append(c)
        for key, sub in c.items():
            if key.endswith("_config") and isinstance(sub, dict):
                walk(sub)

    walk(config)
    return max(found, key=lambda c: c["vocab_size"]) if found else None


def distinct_experts(experts: int, per_token: int, batch: int) -> float:
    """Expected distinct experts one MoE layer runs for `batch` tokens, uniform routing."""
    return experts * (1 - (1 - per_token / experts) ** batch) if experts else 0.0


def step_bytes(m: dict[str, Any], batch: int, context: float, itemsize: int) -> dict[str, float]:
    """Bytes one decode step of `batch` sequences reads: weights (lm_head, layers, routed
    experts, the batch's embedding rows) and the KV cache at `context` tokens (+ its write)."""
    routed = distinct_experts(m["experts"], m["experts_per_token"], batch)
    params = m["vocab"] * m["hidden"] + batch * m["hidden"] + m["layers"] * m["_attn"] \
        + (m["layers"] - m["moe_layers"]) * m["_dense_mlp"] \
        + m["moe_layers"] * (m["_router"] + routed * m["_expert"]) + m["hidden"]
    kv = batch * (context + 1) * 2 * m["layers"] * m["kv_heads"] * m["head_dim"]
    return {"weights": params * itemsize, "kv": kv * itemsize, "routed_experts": routed}


def roofline(result: dict[str, Any], summary: dict[str, Any]) -> list[dict[str, Any]]:
    s = result["settings"]
    context = s["prompt_len"] + s["new_tokens"] / 2  # mean context of the decode steps
    gbps = result["bandwidth"]["gb_per_s"]
    rows = []
    for batch in sorted({1, *(c for c, _ in s["plan"])}):
        b = step_bytes(summary, batch, context, ITEMSIZE[s["dtype"]])
        ms = (b["weights"] + b["kv"]) / (gbps * 1e9) * 1000
        row = {"batch": batch, "weights_mb": round(b["weights"] / 1e6, 1),
               "kv_mb": round(b["kv"] / 1e6, 1), "routed_experts": round(b["routed_experts"], 1),
               "roofline_ms": round(ms, 4), "roofline_tok_s": round(batch / ms * 1000, 1),
               "measured": {}}
        for side, levels in result["results"].items():
            # hf-sequential always decodes at batch 1, whatever the burst's concurrency
            key = min(levels, key=int) if side == "hf-sequential" and batch == 1 else str(batch)
            if side == "hf-sequential" and batch != 1 or key not in levels:
                continue
            step = levels[key].get("step_p50_ms")
            if step:
                row["measured"][side] = {"step_ms": step, "tok_s": round(batch / step * 1000, 1),
                                         "pct_of_roofline": round(ms / step * 100, 1)}
        rows.append(row)
    return rows


def _results_rows(results: dict[str, Any]) -> list[str]:
    rows = []
    for side, levels in results.items():
        for c, r in levels.items():
            rows.append(f"| {side} | {c} | {r['requests']} | {r['tokens_per_s']} | "
                        f"{r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['itl_p50_ms']} | {r['step_p50_ms']} | "
                        f"{r['done_p50_ms']} | {r['short_requests']} |")
    return rows


def _roofline_rows(rows: list[dict[str, Any]], sides: list[str]) -> list[str]:
    out = []
    for r in rows:
        cells = []
        for side in sides:
            m = r["measured"].get(side)
            cells.append(f"{m['step_ms']} ms, {m['tok_s']} tok/s, {m['pct_of_roofline']} %"
                         if m else "")
        out.append(f"| {r['batch']} | {r['weights_mb']} | {r['kv_mb']} | {r['routed_experts']} | "
                   f"{r['roofline_ms']} | {r['roofline_tok_s']} | " + " | ".join(cells) + " |")
    return out


def _verdicts(results: dict[str, Any]) -> list[str]:
    http, inproc = results.get("ours-http", {}), results.get("ours-inproc", {})
    common = sorted(set(http) & set(inproc), key=int)
    out = []
    for c in common:
        h, i = http[c]["ttft_p50_ms"], inproc[c]["ttft_p50_ms"]
        diff = h / i - 1
        target = " (target: within 5 %: " + ("met)" if diff <= TTFT_SLACK else "missed)") \
            if c == common[-1] else ""
        out.append(f"- c={c}: TTFT p50 through HTTP {h} ms vs in-process {i} ms "
                   f"({diff * 100:+.1f} %){target}")
    for side in ("ours-http", "ours-inproc"):
        for c, r in results.get(side, {}).items():
            if "text_chunks_per_token" in r and r["text_chunks_per_token"] < 0.9:
                out.append(f"- {side} c={c}: only {r['text_chunks_per_token']} text chunks per "
                           "token (some tokens decode to no text yet: ITL and TTFT still hold, "
                           "they use usage's token count and the first chunk; a step gap "
                           "after such a token spans two steps)")
    return out or ["- (needs both ours-http and ours-inproc)"]


def _engine(info: dict[str, Any] | None) -> str:
    if not info:
        return "- (no ours-inproc side)"
    return ", ".join(f"{k} {v}" for k, v in info.items() if k not in ("model_dir", "voices"))


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def report(r: dict[str, Any]) -> str:
    """The Markdown report; adds "model" and "roofline" to `r`."""
    config = json.loads((Path(r["model_dir"]) / "config.json").read_text())
    m = model_summary(config)
    r["model"] = {k: v for k, v in m.items() if not k.startswith("_")}
    r["roofline"] = roofline(r, m)
    hw, s, bw = r["hardware"], r["settings"], r["bandwidth"]
    random_weights = (Path(r["model_dir"]) / "omni_fixture.json").is_file()
    moe = (f", {m['experts']} experts (top-{m['experts_per_token']}, moe_intermediate "
           f"{m['moe_intermediate']}) in {m['moe_layers']} layers" if m["experts"] else "")
    gpu = f"; GPU {hw['gpu']} ({hw['gpu_memory_gib']} GiB)" if "gpu" in hw else ""
    sides = list(r["results"])
    return "\n".join([
        "# Autoregressive serving: omni vs transformers generate", "",
        f"Command: `{r['command']}`  ",
        f"Machine: {hw['cpu_model']}, {hw['cores_usable']} cores, {hw['ram_gib']} GiB RAM{gpu}; "
        f"Python {hw['python']}, torch {hw['torch']}, transformers {hw['transformers']}; load "
        f"average at start {hw['loadavg_at_start']}", "",
        f"Model: `{r['model_dir']}` ({m['model_type']}"
        f"{', RANDOM WEIGHTS' if random_weights else ''}): {m['layers']} layers, hidden "
        f"{m['hidden']}, {m['heads']} heads / {m['kv_heads']} KV heads x {m['head_dim']}, "
        f"intermediate {m['intermediate']}{moe}, vocab {m['vocab']}; {_count(m['params'])} "
        f"parameters ({_count(m['active_params'])} active per token).  ",
        f"Run: {s['device']}, {s['dtype']}; prompts of {s['prompt_len']} random token ids, "
        f"exactly {s['new_tokens']} new tokens each (greedy, ignore_eos); (concurrency, "
        f"bursts) {s['plan']}; our engine options: {s.get('engine_options') or 'preset'}.  ",
        f"Copy bandwidth (same run): {bw['gb_per_s']} GB/s ({bw['tensor_gib']:g} GiB "
        f"tensor on {bw['device']}, bytes read + written / time).  ",
        f"Our engine at load: {_engine(r.get('engine_info'))}.  ",
        f"transformers picked: {r.get('transformers_implementation') or '-'}.", "",
        "| side | concurrency | requests | tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | "
        "ITL p50 (ms) | step p50 (ms) | request time p50 (ms) | short requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *_results_rows(r["results"]), "",
        "## Decode step vs the roofline", "",
        f"Roofline step = bytes read / {bw['gb_per_s']} GB/s, at the mean decode context "
        f"({s['prompt_len']} + {s['new_tokens']}/2 tokens). Measured step = step p50 at that "
        "concurrency (hf-sequential: batch 1 always); % = roofline / measured.", "",
        "| batch | weights read (MB) | KV read (MB) | experts / MoE layer | roofline (ms) | "
        "roofline tok/s | " + " | ".join(sides) + " |",
        "|---:|---:|---:|---:|---:|---:|" + "---|" * len(sides),
        *_roofline_rows(r["roofline"], sides), "",
        "## HTTP vs in-process TTFT", "", *_verdicts(r["results"]), "",
        "Method: at concurrency c, c requests start together and TTFT / request time count "
        "from that moment, so queueing is included on every side (hf-sequential serves a "
        "burst one request after another; hf-batched runs it as one generate() call, every "
        "row sharing the batch's first-token time). ITL = (last token - first token) / "
        "(tokens - 1) per request, p50 over requests (prefill steps of other requests that "
        "run meanwhile count in it); step p50 = median gap between consecutive tokens of a "
        "request, over all requests (HTTP: between chunks that carry text; robust to those "
        "prefill steps: the decode step time at that concurrency); tokens/s = output tokens / "
        "wall time of the bursts. HTTP "
        "TTFT is the first SSE chunk with a choice; in-process, the first output with token "
        "ids. Sides run one after another with the model loaded once each (ours-http: a "
        "server subprocess; ours-inproc: AsyncOmni in the benchmark process; the transformers "
        "sides share one load). Routed experts assume uniform routing (random weights route "
        "near-uniformly; trained models do not). Expected distinct experts per layer at batch "
        "B: E * (1 - (1 - k/E)^B). The client runs on the same machine as the server.", ""])
