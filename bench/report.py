"""Derived numbers, the Markdown report and its "Reading" prose, all computed from a run.

Result keys: inprocess (A, per N), unix_socket (B0, raw Unix socket), zmq (B, raw
ZeroMQ: the runtime's transport), engine_process (B2), ours (per N), ours_concurrent, and
optionally before (a previous run, see before()). Every sentence of the Reading is built
from them.
"""

from __future__ import annotations

from typing import Any

from bench.common import QUANTILES, TARGET_US


def derive(r: dict[str, Any], stages: list[int]) -> dict[str, Any]:
    ours, a = r["ours"], r["inprocess"]
    per_hop = {str(n): {q: round((ours[str(n)][f"{q}_us"] - a[str(n)][f"{q}_us"]) / n, 2)
                        for q in QUANTILES} for n in stages}
    unix, zmq, eng = r["unix_socket"], r["zmq"], r["engine_process"]
    d: dict[str, Any] = {
        "transport": "zmq",  # the runtime's transport: B is its floor
        "per_hop_us": per_hop,
        "per_hop_p50_over_unix_us": {n: round(v["p50"] - unix["p50_us"], 2)
                                     for n, v in per_hop.items()},
        "per_hop_p50_over_zmq_us": {n: round(v["p50"] - zmq["p50_us"], 2)
                                    for n, v in per_hop.items()},
        "zmq_minus_unix_us": {q: round(zmq[f"{q}_us"] - unix[f"{q}_us"], 2) for q in QUANTILES},
    }
    if "zmq_idle" in r:  # the transport floor to a peer that sat idle (stages at N > 1)
        d["per_hop_p50_over_zmq_idle_us"] = {n: round(v["p50"] - r["zmq_idle"]["p50_us"], 2)
                                             for n, v in per_hop.items()}
    lo, hi = min(stages), max(stages)
    if hi > lo:
        d["slope_between"] = [lo, hi]
        d["slope_us"] = {q: round((ours[str(hi)][f"{q}_us"] - ours[str(lo)][f"{q}_us"])
                                  / (hi - lo), 2) for q in QUANTILES}
        d["fixed_per_request_p50_us"] = round(
            ours[str(lo)]["p50_us"] - lo * d["slope_us"]["p50"], 2)
        hop = d["slope_us"]["p50"]  # a marginal hop, engine work included
    else:
        hop = ours[str(hi)]["p50_us"] / hi
    work_1 = (a["1"] if "1" in a else a[str(lo)])["p50_us"] / (1 if "1" in a else lo)
    work = a[str(hi)]["p50_us"] / hi
    loop = eng["p50_us"] - zmq["p50_us"] - work_1
    d["hop_breakdown_p50_us"] = {
        "hop": round(hop, 2),
        "transport_floor": zmq["p50_us"],
        "engine_loop": round(loop, 2),
        "engine_work": round(work, 2),
        "engine_work_one_stage": round(work_1, 2),
        "orchestrator": round(hop - zmq["p50_us"] - loop - work, 2),
    }
    return d


def before(prev: dict[str, Any], label: str, source: str) -> dict[str, Any]:
    """What to compare with from a previous core.json. Its transport is the one its
    derived numbers name; runs without one are from the Unix-socket runtime (B0)."""
    transport = prev.get("derived", {}).get("transport", "unix_socket")
    floor = prev[transport]["p50_us"]
    per_hop = {n: {"p50": v["p50"], "p99": v["p99"]}
               for n, v in prev["derived"]["per_hop_us"].items()}
    return {
        "label": label, "source": source, "command": prev["command"], "date": prev["date"],
        "machine": f"{prev['hardware']['cpu_model']}, {prev['hardware']['cores']} cores",
        "cores": prev["hardware"]["cores"], "transport": transport, "per_hop_us": per_hop,
        "per_hop_p50_over_transport_us": {n: round(v["p50"] - floor, 2)
                                          for n, v in per_hop.items()},
        "p50_us": {k: prev[k]["p50_us"] for k in ("unix_socket", "zmq", "engine_process")},
        "slope_p50_us": prev["derived"].get("slope_us", {}).get("p50"),
    }


def summary_lines(r: dict[str, Any]) -> str:
    d = r["derived"]
    lines = [f"per-hop p50 overhead (target <= {TARGET_US:.0f} us): " + ", ".join(
        f"N={n}: {v['p50']:.1f} us" for n, v in d["per_hop_us"].items())]
    if "slope_us" in d:
        lo, hi = d["slope_between"]
        lines.append(f"marginal stage cost (slope N={lo}..{hi}): p50 {d['slope_us']['p50']:.1f}"
                     f" us, p99 {d['slope_us']['p99']:.1f} us")
    lines.append(f"round trips p50: B0 raw unix socket {r['unix_socket']['p50_us']:.1f} us, "
                 f"B raw zmq {r['zmq']['p50_us']:.1f} us, B2 engine process "
                 f"{r['engine_process']['p50_us']:.1f} us")
    lines.append("per-hop p50 - B (raw zmq) p50: " + ", ".join(
        f"N={n}: {v:.1f} us" for n, v in d["per_hop_p50_over_zmq_us"].items()))
    if r.get("before"):
        b = r["before"]
        lines.append(f"{b['label']}: per-hop p50 - {_NAMES[b['transport']]} p50: " + ", ".join(
            f"N={n}: {v:.1f} us" for n, v in b["per_hop_p50_over_transport_us"].items()))
    return "\n".join(lines)


def _row(name: str, s: dict[str, Any], extra: str = "") -> str:
    return (f"| {name} | {s['p50_us']:.1f} | {s['p90_us']:.1f} | {s['p99_us']:.1f} | "
            f"{s['mean_us']:.1f} | {extra} |")


def _steal(r: dict[str, Any]) -> str:
    share = r.get("cpu_steal_share")
    return "" if share is None else (f"; CPU steal over the run {100 * share:.1f}% (vCPU time "
                                     "the hypervisor gave to other guests)")


def _bytes(s: dict[str, Any]) -> str:
    return f"{s['request_bytes']} B out / {s['reply_bytes']} B back"


def render_markdown(r: dict[str, Any]) -> str:
    hw, d, s = r["hardware"], r["derived"], r["settings"]
    vm = f", {hw['hypervisor']} VM" if hw.get("hypervisor") else ""
    lines = [
        "# Core overhead: orchestrator cost per hop",
        "",
        f"Date: {r['date']}  ",
        f"Command: `{r['command']}` (wall {r['wall_s']} s)",
        "",
        "## Machine",
        "",
        f"- CPU: {hw['cpu_model']}, {hw['cores']} cores ({hw['cores_usable']} usable){vm}, "
        f"RAM {hw['ram_gib']} GiB",
        f"- {hw['os']}; load average at start {hw['loadavg_at_start']}, at end "
        f"{r.get('loadavg_at_end')} (1/5/15 min)" + _steal(r),
        f"- Python {hw['python']}, uvloop {hw['uvloop']}, msgpack {hw['msgpack']}, "
        f"pyzmq {hw['pyzmq']} / libzmq {hw['libzmq']} (the control plane, B, B2, ours)",
        f"- OMP_NUM_THREADS={s['OMP_NUM_THREADS']}; {s['requests']} measured requests per "
        f"row after {s['warmup']} dropped warmup requests; prompt {s['prompt_chars']} chars; "
        "time.perf_counter_ns",
        "",
        "## Latency per request (us)",
        "",
        "Concurrency 1 unless said otherwise; every round trip goes to one spawned process. "
        "Every message is `omni.wire.protocol.encode`'s (a msgspec struct as a tagged msgpack "
        "array). *B0* = raw Unix socket: a stream socket, the messages behind a 4-byte "
        "length, to a bare echo loop (the transport omni used before ZeroMQ; a baseline). "
        "*B* = raw ZeroMQ: a "
        "ROUTER here, a DEALER child with a bare echo loop, ipc, one frame per message: the "
        "runtime's socket pattern, its transport floor. *B2* = a ROUTER bound as "
        "`omni/runtime/control.py` binds it, driving the real engine process "
        "(`omni.engines.proc.run_engine_process` around an EchoEngine, identity `s/0@0`). "
        "*A* = N echo engines chained in-process (the engine work, no sockets). *ours* = "
        "`AsyncOmni.generate()` on uvloop to the finished output over `s0 -> ... -> "
        "s{N-1}`, control plane on ZeroMQ.",
        "",
        "| configuration | p50 | p90 | p99 | mean | notes |",
        "|---|---:|---:|---:|---:|---|",
        _row("B0 raw Unix socket round trip, bare echo", r["unix_socket"],
             f"baseline: a plain stream socket; {_bytes(r['unix_socket'])}"),
        _row("B raw ZeroMQ ipc round trip (ROUTER-DEALER), bare echo", r["zmq"],
             f"the runtime's transport floor; {_bytes(r['zmq'])}"),
        _row("B2 omni engine process (echo), sync ROUTER client", r["engine_process"],
             "B + `run_engine_process`'s loop + EchoEngine"),
    ]
    gap = s.get("idle_gap_us")
    for key, name in _IDLE_ROWS:
        if key in r:
            lines.append(_row(f"{name}, idle {gap} us before each", r[key],
                              "the peer's threads asleep when the message comes"))
    for n, stats in r["inprocess"].items():
        lines.append(_row(f"A in-process, N={n}", stats))
    for n, stats in r["ours"].items():
        lines.append(_row(f"ours, N={n}", stats, f"startup {stats['startup_s']} s"))
    c = r["ours_concurrent"]
    if c:
        lines.append(_row(f"ours, N={c['stages']}, concurrency {c['concurrency']}", c,
                          f"**{c['throughput_rps']:.0f} req/s** ({c['count']} requests in "
                          f"{c['wall_s']} s)"))
    lines += [
        "",
        f"## Per-hop overhead vs the {TARGET_US:.0f} us target",
        "",
        "per-hop(N) = (ours(N) - A(N)) / N, per percentile (a difference of percentiles, "
        "not a percentile of differences).",
        "",
        "| N | per-hop p50 | per-hop p90 | per-hop p99 | per-hop mean | p50 - B (raw ZeroMQ) "
        f"p50 | p50 - B idle p50 | p50 - B0 (raw Unix) p50 | p50 <= {TARGET_US:.0f} us? |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    over_idle = d.get("per_hop_p50_over_zmq_idle_us", {})
    for n, v in d["per_hop_us"].items():
        ok = "yes" if v["p50"] <= TARGET_US else "**no**"
        idle = f"{over_idle[n]:.1f}" if n in over_idle else "n/a"
        lines.append(f"| {n} | {v['p50']:.1f} | {v['p90']:.1f} | {v['p99']:.1f} | "
                     f"{v['mean']:.1f} | {d['per_hop_p50_over_zmq_us'][n]:.1f} | {idle} | "
                     f"{d['per_hop_p50_over_unix_us'][n]:.1f} | {ok} |")
    if "slope_us" in d:
        lo, hi = d["slope_between"]
        sl = d["slope_us"]
        ok = "meets" if sl["p50"] <= TARGET_US else "misses"
        lines += [
            "",
            f"Marginal cost of one more stage, slope (ours(N={hi}) - ours(N={lo})) / {hi - lo}: "
            f"p50 **{sl['p50']:.1f} us**, p90 {sl['p90']:.1f} us, p99 {sl['p99']:.1f} us, "
            f"mean {sl['mean']:.1f} us; it {ok} the {TARGET_US:.0f} us target.",
        ]
    if r.get("before"):
        lines += _before_lines(r)
    lines += ["", "## Reading", "", *reading(r), ""]
    return "\n".join(lines)


_IDLE_ROWS = (("unix_socket_idle", "B0 raw Unix socket"), ("zmq_idle", "B raw ZeroMQ"),
              ("engine_process_idle", "B2 omni engine process"))
_NAMES = {"unix_socket": "B0 (raw Unix)", "zmq": "B (raw ZeroMQ)"}


def _before_lines(r: dict[str, Any]) -> list[str]:
    b, d = r["before"], r["derived"]
    now_hw = r["hardware"]
    lines = [
        "", f"## Now vs {b['label']}", "",
        f"{b['label']}: `{b['command']}` on {b['machine']}, {b['date']} (read from "
        f"`{b['source']}`). Its runtime's transport floor was {_NAMES[b['transport']]}; "
        "this run's is B (raw ZeroMQ). The target: what the runtime adds on top of its own "
        "transport, per-hop p50 minus that transport's round trip, should not grow.",
    ]
    if b["cores"] != now_hw["cores"]:
        lines += ["", f"**Different machines** ({b['cores']} cores then, {now_hw['cores']} "
                  "now): compare with care."]
    lines += [
        "",
        "| N | per-hop p50 now | before | per-hop p99 now | before | now: p50 - B p50 | "
        f"before: p50 - {_NAMES[b['transport']]} p50 | change |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, v in d["per_hop_us"].items():
        old = b["per_hop_us"].get(n)
        if old is None:
            continue
        now_over, old_over = d["per_hop_p50_over_zmq_us"][n], b["per_hop_p50_over_transport_us"][n]
        lines.append(f"| {n} | {v['p50']:.1f} | {old['p50']:.1f} | {v['p99']:.1f} | "
                     f"{old['p99']:.1f} | {now_over:.1f} | {old_over:.1f} | "
                     f"{now_over - old_over:+.1f} |")
    p = b["p50_us"]
    lines += ["", "| p50 (us) | now | before |", "|---|---:|---:|",
              f"| B0 raw Unix socket | {r['unix_socket']['p50_us']:.1f} | {p['unix_socket']:.1f} |",
              f"| B raw ZeroMQ | {r['zmq']['p50_us']:.1f} | {p['zmq']:.1f} |",
              f"| B2 engine process (each over its runtime's transport) | "
              f"{r['engine_process']['p50_us']:.1f} | {p['engine_process']:.1f} |"]
    if b["slope_p50_us"] is not None and "slope_us" in d:
        lines.append(f"| slope (one more stage) | {d['slope_us']['p50']:.1f} | "
                     f"{b['slope_p50_us']:.1f} |")
    return lines


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "n/a"


def _versus(value: float, target: float) -> str:
    if value <= target:
        return f"meets the {target:.0f} us target ({target - value:.0f} us to spare)"
    return f"misses the {target:.0f} us target by {value - target:.0f} us ({value / target:.1f}x)"


def _idle_reading(r: dict[str, Any]) -> str:
    b0, b, b2 = r["unix_socket"], r["zmq"], r["engine_process"]
    i0, i, i2 = r["unix_socket_idle"], r["zmq_idle"], r["engine_process_idle"]
    over = r["derived"]["per_hop_p50_over_zmq_idle_us"]
    return (
        f"- Waking an idle peer ({r['settings']['idle_gap_us']} us asleep before each round "
        f"trip): raw Unix {i0['p50_us']:.0f} us p50 ({i0['p50_us'] - b0['p50_us']:+.0f} "
        f"against busy), raw ZeroMQ {i['p50_us']:.0f} us ({i['p50_us'] - b['p50_us']:+.0f}), "
        f"the engine process {i2['p50_us']:.0f} us ({i2['p50_us'] - b2['p50_us']:+.0f}). "
        "In an N-stage pipeline every stage but the one running is idle, so from N=2 on a "
        "hop pays the idle figure; per-hop p50 minus B idle p50: " + ", ".join(
            f"N={n} {v:.0f} us" for n, v in over.items()) + ".")


def reading(r: dict[str, Any]) -> list[str]:
    d, hw = r["derived"], r["hardware"]
    per_hop = d["per_hop_us"]
    n_max = max(per_hop, key=int)
    hop = per_hop[n_max]
    b0, b, b2 = r["unix_socket"], r["zmq"], r["engine_process"]
    bd = d["hop_breakdown_p50_us"]
    out = [
        "- Per-hop overhead, (ours(N) - A(N)) / N at p50: " + ", ".join(
            f"N={n} {v['p50']:.0f} us" for n, v in per_hop.items())
        + f". At N={n_max} a hop costs {hop['p50']:.0f} us at p50 (p99 {hop['p99']:.0f} us), "
        f"which {_versus(hop['p50'], TARGET_US)}.",
        f"- The runtime's transport floor is ZeroMQ: B, a ROUTER here and a bare DEALER "
        f"child echoing over ipc, takes {b['p50_us']:.0f} us p50 / {b['p99_us']:.0f} us p99 "
        f"per round trip. A raw Unix stream socket (B0, the same messages behind a length) "
        f"takes {b0['p50_us']:.0f} us p50 / {b0['p99_us']:.0f} us p99: two process wake-ups, "
        f"about {b0['p50_us'] / 2:.0f} us each on this machine.",
    ]
    extra, extra99 = d["zmq_minus_unix_us"]["p50"], d["zmq_minus_unix_us"]["p99"]
    if extra > 0:
        out.append(
            f"- ZeroMQ costs {extra:.0f} us more than the raw Unix socket at p50 "
            f"({b['p50_us'] / b0['p50_us']:.1f}x) and {extra99:+.0f} us at p99: each message "
            "is handed from the sending thread to libzmq's I/O thread and from the receiving "
            "I/O thread to the reader, wake-ups a plain stream socket does not have. What it "
            "buys: the engine's I/O thread receives while the engine is inside a step "
            "(`python -m bench.channel_lag`), with no drainer thread of ours.")
    else:
        out.append(
            f"- ZeroMQ (B) took {b['p50_us']:.0f} us p50 against the raw Unix socket's "
            f"{b0['p50_us']:.0f} us: in this run its I/O threads did not cost more than the "
            "plain socket at p50.")
    if "zmq_idle" in r:
        out.append(_idle_reading(r))
    b2_text = (f"- The real engine process (B2) behind the same ROUTER takes "
               f"{b2['p50_us']:.0f} us p50 / {b2['p99_us']:.0f} us p99, "
               f"{b2['p50_us'] - b['p50_us']:+.0f} us against B. ")
    if bd["engine_loop"] > 0:
        b2_text += (f"Of that, {bd['engine_work_one_stage']:.0f} us is EchoEngine's own add + "
                    f"step (A, N=1) and about {bd['engine_loop']:.0f} us is "
                    "`run_engine_process`'s loop (recv, decode, dispatch, has_work/step, "
                    "stats, encode, send, on the main thread).")
    else:
        b2_text += (f"With EchoEngine's own add + step at {bd['engine_work_one_stage']:.0f} us "
                    "(A, N=1), `run_engine_process`'s loop cost nothing measurable over the "
                    "bare echo loop in this run: it is below the noise.")
    out.append(b2_text)
    if "slope_us" in d:
        lo, hi = d["slope_between"]
        slope = d["slope_us"]["p50"]
        parts = {"the transport floor (B, raw ZeroMQ)": bd["transport_floor"],
                 "the engine process's loop (B2 - B - A)": bd["engine_loop"],
                 "the engine work (A)": bd["engine_work"],
                 "the orchestrator side (uvloop wake-up, ROUTER receive and decode, "
                 "routing, metrics, encode, send; the remainder)": bd["orchestrator"]}
        split = "; ".join(f"{k} {v:.0f} us ({_pct(v, slope)})" for k, v in parts.items())
        top = max(parts, key=parts.get)
        noisy = [k.split(" (")[0] for k, v in parts.items() if v < 0]
        out.append(
            f"- One more stage (slope N={lo}..{hi}) costs {slope:.0f} us at p50, which "
            f"{_versus(slope, TARGET_US)}. Split at p50 (differences of medians, so "
            f"approximate): {split}. The largest part is {top}."
            + (f" Negative parts ({', '.join(noisy)}) mean those differences are below this "
               "run's noise." if noisy else ""))
        first = per_hop[str(lo)]["p50"]
        fixed = d["fixed_per_request_p50_us"]
        out.append(
            f"- Fitting ours(N) = F + N x slope through N={lo} and N={hi} gives F = "
            f"{fixed:.0f} us at p50: the part paid once per request (submit, the client "
            "queue and generate()'s async iteration, the final output, request metrics). "
            + (f"Per-hop overhead falls from {first:.0f} us at N={lo} to {hop['p50']:.0f} us "
               f"at N={n_max} because F is spread over more hops."
               if fixed > 0.15 * slope else
               f"F is negative: ours grows faster than linearly with N, so per-hop overhead "
               f"rises from {first:.0f} us at N={lo} to {hop['p50']:.0f} us at N={n_max}"
               + (f" ({hi + 1} processes on {hw['cores_usable']} cores at N={hi}: each stage "
                  "adds a process to schedule)." if hi + 1 > hw["cores_usable"] else ".")
               if fixed < -0.15 * slope else
               f"F is small against the slope, so per-hop overhead is about the same at every "
               f"N ({first:.0f} us at N={lo}, {hop['p50']:.0f} us at N={n_max})."))
    c = r["ours_concurrent"]
    if c:
        per_req = 1e6 / c["throughput_rps"]
        serial = r["ours"].get(str(c["stages"]))
        procs = c["stages"] + 1
        line = (f"- At concurrency {c['concurrency']} with N={c['stages']}: "
                f"{c['throughput_rps']:.0f} req/s, {per_req:.0f} us of wall time per request "
                f"({per_req / c['stages']:.0f} us per hop), p50 latency {c['p50_us']:.0f} us. ")
        if serial:
            gain = serial["mean_us"] / per_req
            line += (f"One at a time the same pipeline gives {1e6 / serial['mean_us']:.0f} "
                     f"req/s (1 / mean latency) at p50 {serial['p50_us']:.0f} us: concurrency "
                     f"multiplies throughput by {gain:.1f} and p50 latency by "
                     f"{c['p50_us'] / serial['p50_us']:.1f}. ")
        line += (f"{procs} busy processes ({c['stages']} engines + the orchestrator) share "
                 f"{hw['cores_usable']} cores, so requests queue for CPU")
        if serial and gain > 1:
            line += ("; the wall time per request still drops because each wake-up reads "
                     "and writes several messages at once.")
        else:
            line += "."
        out.append(line)
    slope = d.get("slope_us", {}).get("p50", hop["p50"])
    out.append(f"- For scale: vLLM-Omni is reported at 3-9 ms per extra stage; this run's "
               f"{'marginal stage' if 'slope_us' in d else 'per-hop overhead'} is {slope:.0f} us ({3000 / slope:.0f}-{9000 / slope:.0f}x less)."
               if slope > 0 else "- The slope is not positive in this run: it is within noise.")
    rows = {"B0": b0, "B": b, "B2": b2, **{f"ours N={n}": v for n, v in r["ours"].items()}}
    drift = {k: abs(v["halves_p50_us"][0] - v["halves_p50_us"][1]) / v["p50_us"]
             for k, v in rows.items() if v["p50_us"] > 0}
    worst = max(drift, key=drift.get)
    kind = f"{hw['hypervisor']} VM" if hw.get("hypervisor") else "machine"
    out.append(
        f"- Noise: a shared {hw['cores_usable']}-core {kind}; load average "
        f"{hw['loadavg_at_start'][0]:.2f} at start and {r['loadavg_at_end'][0]:.2f} at end "
        f"(1 min)" + (f", CPU steal {100 * r['cpu_steal_share']:.1f}% of the run's vCPU time"
                      if r.get("cpu_steal_share") is not None else "")
        + ". The orchestrator and every engine loop contend for the same cores, so p99 "
        f"reflects scheduler wake-ups and GC pauses more than code paths. Within this run the "
        f"p50 of a row's first and second half differ by up to {100 * drift[worst]:.0f}% "
        f"({worst}); compare medians across runs, and p99s only between idle runs.")
    return out
