"""The soak's judgement (bench/soak.py): each answer against its reference, failures
against the kills, memory samples against growth, the drain against its promises; and the
Markdown report."""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench.common import percentile
from bench.soak_workload import KINDS, ROUTES, Settings

GROWTH_LIMIT = 0.05  # PSS, /dev/shm and fds: last samples vs first after warm-up
KILL_GRACE_S = 5.0  # a request that began up to this long after its stage came back may
# still have been placed while the restarted replica was connecting
DRAIN_CODES = ("shutting_down", "server_stopped", "aborted")


def compare(kind: str, got: dict[str, Any], want: dict[str, Any], s: Settings,
            tolerance: float) -> str | None:
    """None when the answer matches its reference, else what differs."""
    problems = []
    if kind in ("chat", "chat_audio", "transcription") and got["text"] != want["text"]:
        problems.append(f"text {got['text']!r} != reference {want['text']!r}")
    if want.get("audio_sha") and got.get("audio_sha") != want["audio_sha"]:
        # the runs alone were equal sample for sample (the voice without its noise)
        problems.append(f"audio differs from the runs alone, which were equal sample for "
                        f"sample ({_length(got)} vs {_length(want)})")
    for key in ("pcm_bytes", "duration_s"):
        if key not in want:
            continue
        # the runs alone spread too (Piper's random durations): the band spans them all
        runs = want.get(f"{key}_runs") or [want[key]]
        low, high = min(runs) * (1 - tolerance), max(runs) * (1 + tolerance)
        if not low <= got[key] <= high:
            problems.append(f"audio {key} {got[key]} vs reference {want[key]} (runs alone "
                            f"{min(runs)}..{max(runs)}; beyond {tolerance:.0%} of them)")
    if kind == "image" and got["size"] != s.image_size:
        problems.append(f"image {got['size']}, asked {s.image_size}")
    if kind == "video" and (got["size"], got["frames"]) != (s.video_size, s.video_frames):
        problems.append(f"video {got['frames']} frames {got['size']}, asked "
                        f"{s.video_frames} frames {s.video_size}")
    return "; ".join(problems) or None


def _length(answer: dict[str, Any]) -> str:
    return ", ".join(f"{k} {answer[k]}" for k in ("pcm_bytes", "duration_s") if k in answer)


def explained_by_kill(record: dict[str, Any], kills: list[dict[str, Any]], end: float) -> bool:
    """A typed failure of a request that overlapped the outage of a stage on its route."""
    for kill in kills:
        stage = tuple(kill.get("stage") or ())
        if "pid" in kill and (not stage or stage in ROUTES[record["kind"]]):
            back = kill.get("back", end)
            if kill["t"] - 1.0 <= record["t1"] and record["t0"] <= back + KILL_GRACE_S:
                return True
    return False


def verdict(r: dict[str, Any], args: Any) -> dict[str, Any]:
    reasons: list[str] = []
    drain = r["drain"]
    t_term = drain.get("t_term")
    exit_at = t_term + drain["exit_s"] if t_term is not None else float("inf")
    per_kind = {k: {"ok": 0, "typed": 0, "hung": 0, "wrong": 0, "untyped": 0, "cut": 0,
                    "latency_s": []} for k in KINDS}
    unexplained = []
    for rec in (x for x in r["records"] if x["phase"] == "load" and "t1" in x):
        status = rec["status"]
        if rec["kind"] == "video" and status == "untyped" and rec["t1"] >= exit_at - 1:
            status = rec["status"] = "cut"  # its job outlived the server: checked on disk
        row = per_kind[rec["kind"]]
        row[status] += 1
        if status == "ok":
            row["latency_s"].append(rec["t1"] - rec["t0"])
        elif status == "typed" and not _typed_ok(rec, r["kills"], t_term, args):
            unexplained.append(rec)
    for kind, row in per_kind.items():
        for bad in ("hung", "wrong", "untyped"):
            if row[bad]:
                reasons.append(f"{kind}: {row[bad]} {bad} (e.g. {_example(r, kind, bad)})")
    if unexplained:
        reasons.append(f"{len(unexplained)} typed failures far from any kill of their stage "
                       f"(e.g. {unexplained[0]['kind']}: {unexplained[0]['detail']})")
    memory = growth(r["samples"], args.warmup)
    reasons += memory.pop("reasons")
    reasons += _kill_reasons(r["kills"], args)
    reasons += _death_reasons(r.get("liveness"), r["kills"])
    reasons += _drain_reasons(drain, r.get("videos_left", []))
    for row in per_kind.values():
        lat = sorted(row.pop("latency_s"))
        row["p50_s"] = round(percentile(lat, 0.5), 3) if lat else None
        row["p99_s"] = round(percentile(lat, 0.99), 3) if lat else None
    return {"pass": not reasons, "reasons": reasons, "per_kind": per_kind, "memory": memory}


def _typed_ok(rec: dict[str, Any], kills: list[dict[str, Any]], t_term: float | None,
              args: Any) -> bool:
    if explained_by_kill(rec, kills, rec["t1"]):
        return True
    # in flight at SIGTERM: aborted only past the drain timeout
    return t_term is not None and rec["code"] in DRAIN_CODES \
        and rec["t1"] >= t_term + args.drain_timeout - 1.0


def _example(r: dict[str, Any], kind: str, status: str) -> str:
    rec = next(x for x in r["records"] if x["kind"] == kind and x.get("status") == status)
    return f"t={rec['t0']}..{rec['t1']} s: {rec.get('detail')}"


def growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """First vs last samples after warm-up, taken while every replica was up (a killed
    replica's restart moves memory for a while): medians of three at each end."""
    usable = [s for s in samples if s["t"] >= warmup_s and s["all_up"]]
    out: dict[str, Any] = {"samples": len(samples), "usable": len(usable), "reasons": []}
    if len(usable) < 4:
        out["reasons"].append(f"only {len(usable)} samples after warm-up with every replica "
                              "up: too few to judge growth (run longer or sample more often)")
        return out
    for key in ("pss_bytes", "rss_bytes", "shm_bytes", "fds", "engine_bytes", "processes",
                "sem_files"):
        first = statistics.median(s[key] for s in usable[:3])
        last = statistics.median(s[key] for s in usable[-3:])
        change = (last - first) / first if first else (0.0 if last == first else float("inf"))
        out[key] = {"first": first, "last": last, "change": round(change, 4),
                    "min": min(s[key] for s in usable), "max": max(s[key] for s in usable),
                    "slope_per_min": round(_slope(usable, key) * 60, 1)}
        if key in ("pss_bytes", "shm_bytes", "fds") and abs(change) > GROWTH_LIMIT:
            out["reasons"].append(f"{key} changed {change:+.1%} after warm-up "
                                  f"({first:.0f} -> {last:.0f}; limit +-{GROWTH_LIMIT:.0%})")
    out["by_process"] = _process_growth(usable)
    return out


def _process_growth(usable: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """PSS of each process alive in the first and the last usable samples, most grown
    first: where growth of the sum comes from (a restarted replica is a new pid)."""
    first, last = usable[0].get("pss_by_pid", {}), usable[-1].get("pss_by_pid", {})
    rows = [{"process": key, "first": first[key], "last": last[key],
             "change": last[key] - first[key]} for key in first if key in last]
    return sorted(rows, key=lambda row: -abs(row["change"]))[:6]


def _slope(samples: list[dict[str, Any]], key: str) -> float:
    ts, ys = [s["t"] for s in samples], [s[key] for s in samples]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var if var else 0.0


def _kill_reasons(kills: list[dict[str, Any]], args: Any) -> list[str]:
    done = [k for k in kills if "pid" in k]
    if args.kill_every > 0 and not done:
        return ["chaos was asked for but no replica was killed"]
    return [f"the replica killed at {k['t']} s (pid {k['pid']}) never came back"
            for k in done if "back" not in k]


def _death_reasons(liveness: dict[str, Any] | None, kills: list[dict[str, Any]]) -> list[str]:
    """Every replica the server declared dead must be one the soak killed: any other
    death is a false one (a busy replica taken for a gone one: issue 43) or a crash."""
    if liveness is None:
        return []
    extra = liveness["deaths"] - len([k for k in kills if "pid" in k])
    return [f"{extra} replica deaths that no kill explains (e.g. "
            f"{liveness['down'][-1] if liveness['down'] else '?'})"] if extra > 0 else []


def _drain_reasons(d: dict[str, Any], videos: list[dict[str, Any]]) -> list[str]:
    if "t_term" not in d:
        return [] if d.get("exit_code") == 0 else [f"server exit code {d.get('exit_code')}"]
    reasons = []
    if d["exit_code"] != 0:
        reasons.append(f"after SIGTERM the server's exit code was {d['exit_code']} "
                       f"(None: still running after {d['limit_s']} s)")
    if d["processes_left"]:
        reasons.append(f"processes left after the server exited: {d['processes_left']}")
    if d["shm_left"]["shm_files"]:
        reasons.append(f"/dev/shm blocks left: {d['shm_left']}")
    if d["mapped_shm_left"]:
        reasons.append(f"/dev/shm files the tree had mapped are still there: "
                       f"{d['mapped_shm_left']}")
    if d["in_flight_after_probes"]:  # the drain was still on while every probe was answered
        for p in d["probes"]:
            # refused at once: a video job accepted and failed later is not a refusal
            if p.get("code") != "shutting_down" or not p["detail"].startswith("HTTP 503"):
                reasons.append(f"probe {p['kind']} during the drain: {p['status']} "
                               f"{p.get('detail')} (want 503 shutting_down)")
    for job in videos:
        if job["status"] != "completed":
            reasons.append(f"video job {job['id']} in flight at SIGTERM ended {job['status']}: "
                           f"{job.get('error')}")
    return reasons


def markdown(r: dict[str, Any], description: str) -> str:
    v, hw, d = r["verdict"], r["hardware"], r["drain"]
    kills = [k for k in r["kills"] if "pid" in k]
    lines = [f"# Soak + chaos: {'PASS' if v['pass'] else 'FAIL'}", "",
             f"Command: `{r['command']}`  ",
             f"Machine: {hw['cpu_model']}, {hw['cores']} cores, {hw['ram_gib']} GiB, Python "
             f"{hw['python']}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load "
             f"average at start {hw['loadavg_at_start']}  ",
             f"{r['clients']} clients for {r['seconds']:g} s; mix {r['mix']}; "
             f"deadlines {r['deadlines']}", "",
             *(f"- **{reason}**" for reason in v["reasons"]), "",
             "| kind | ok | typed error | hung | wrong | untyped | cut by exit | p50 s | p99 s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
             *(f"| {k} | {x['ok']} | {x['typed']} | {x['hung']} | {x['wrong']} | "
               f"{x['untyped']} | {x['cut']} | {x['p50_s']} | {x['p99_s']} |"
               for k, x in v["per_kind"].items()), "",
             *_audio_reference_lines(r["references"]),
             f"Kills: {len(kills)} ({', '.join(_kill_text(k) for k in kills) or 'none'})", "",
             *_liveness_lines(r.get("liveness"), r.get("cpu_hog"), len(kills)),
             *_memory_lines(v["memory"]), "", *_drain_lines(d, r.get("videos_left", [])), "",
             *_exit_warnings(r.get("server_log_tail", [])),
             "## Method", "", description.split("\n\n", 1)[1].strip(), ""]
    return "\n".join(lines)


def _audio_reference_lines(references: dict[str, Any]) -> list[str]:
    runs = [(name, x) for name, ref in references.items() for key, x in ref.items()
            if key.endswith("_runs")]
    spread = [f"{name} {min(x) / statistics.median(x) - 1:+.1%}..."
              f"{max(x) / statistics.median(x) - 1:+.1%}" for name, x in runs]
    exact = [name for name, ref in references.items() if ref.get("audio_sha")]
    same = (f"; equal sample for sample, so answers under load must be too: "
            f"{', '.join(exact)}" if exact else "")
    return [f"Spoken references: each the median of {len(runs[0][1])} runs alone; their "
            f"spread around it: {'; '.join(spread)}{same}", ""] if runs else []


def _exit_warnings(log_tail: list[str]) -> list[str]:
    """What multiprocessing's resource tracker cleaned up at the server's exit: objects of
    killed replicas that nobody else frees (reported, not judged: they are gone after)."""
    leaked = [line.strip() for line in log_tail if "leaked" in line]
    return ["Cleaned up by the resource tracker at exit (from the server's log):", "",
            *(f"    {line}" for line in leaked), ""] if leaked else []


def _liveness_lines(liveness: dict[str, Any] | None, hog: dict[str, Any] | None,
                    kills: int) -> list[str]:
    """The liveness row: replicas declared dead (each must be a kill), slow heartbeats
    (late but alive: not deaths), and the CPU hog beside the server, if any."""
    if liveness is None:
        return []
    load = (f"{hog['processes']} busy processes on {hog['cores']} cores at nice "
            f"{hog['nice']} for {hog['seconds']:g} s, load average {hog['loadavg_before'][0]}"
            f" -> {hog['loadavg_after'][0]}" if hog else "none")
    return ["Liveness (from the server's log; a slow heartbeat is a late one from a replica "
            "that is alive, warned at most every 30 s per replica, not a death):", "",
            "| CPU hog | replicas declared dead | of them killed | restarts | "
            "slow-heartbeat warnings |", "|---|---:|---:|---:|---:|",
            f"| {load} | {liveness['deaths']} | {kills} | {liveness['restarts']} | "
            f"{liveness['slow_heartbeats']} |", ""]


def _kill_text(k: dict[str, Any]) -> str:
    stage = "/".join(k.get("stage") or ["?"])
    back = f", back {k['back'] - k['t']:.1f} s later" if "back" in k else ", not back"
    return f"{k['t']:.0f} s {stage}{back}"


def _memory_lines(m: dict[str, Any]) -> list[str]:
    lines = [f"Samples: {m['samples']}, {m.get('usable', 0)} after warm-up with every replica "
             "up (first = median of the first three of those, last = of the last three)", "",
             "| measure | first | last | change | min | max | slope per min |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for key, unit in (("pss_bytes", 2**20), ("rss_bytes", 2**20), ("shm_bytes", 2**20),
                      ("engine_bytes", 2**20), ("fds", 1), ("processes", 1),
                      ("sem_files", 1)):
        if key in m:
            x, name = m[key], key.replace("_bytes", " MiB")
            lines.append(f"| {name} | {x['first'] / unit:.1f} | {x['last'] / unit:.1f} | "
                         f"{x['change']:+.1%} | {x['min'] / unit:.1f} | {x['max'] / unit:.1f} "
                         f"| {x['slope_per_min'] / unit:+.2f} |")
    if m.get("by_process"):
        lines += ["", "PSS by process (alive at the first and the last usable sample): " + ", ".join(
            f"{row['process']} {row['first'] / 2**20:.0f} -> {row['last'] / 2**20:.0f} MiB"
            for row in m["by_process"])]
    return lines


def _drain_lines(d: dict[str, Any], videos: list[dict[str, Any]]) -> list[str]:
    if "t_term" not in d:
        return ["Drain: not checked (--no-drain)"]
    probes = ", ".join(f"{p['kind']}: {p.get('code') or p['status']}" for p in d["probes"])
    return [f"Drain: SIGTERM at {d['t_term']:.1f} s with {d['in_flight']} requests in flight "
            f"({d['in_flight_after_probes']} still running when the probes were answered); "
            f"probes: {probes}; exit code {d['exit_code']} after {d['exit_s']} s (limit "
            f"{d['limit_s']:g} s); processes left {len(d['processes_left'])}; /dev/shm blocks "
            f"left {d['shm_left']['shm_files']}, of any file it had mapped there "
            f"{len(d.get('mapped_shm_left', []))}; video jobs left on disk "
            f"{[j['status'] for j in videos]}"]
