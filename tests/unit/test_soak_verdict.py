"""The soak's judgement (bench/soak_report.py) on results made here: a clean run passes,
and each way docs/reliability.md says a run fails makes it fail, with its reason; answers
against their reference at the default audio tolerance, which the docs state."""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import pytest

from bench import soak, soak_report
from bench.soak_workload import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
WARMUP = 20.0


def args(**overrides) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    parsed = parser.parse_args(["--kill-every", "20", "--warmup", str(WARMUP)])
    for key, value in overrides.items():
        setattr(parsed, key, value)
    return parsed


def sample(t: float, pss: float = 1e9, shm: float = 1e8, fds: int = 400,
           all_up: bool = True) -> dict:
    return {"t": t, "all_up": all_up, "pss_bytes": pss, "rss_bytes": 2 * pss,
            "shm_bytes": shm, "fds": fds, "engine_bytes": 1e7, "processes": 7,
            "sem_files": 3, "pss_by_pid": {"server": pss / 2, "llm": pss / 2}}


def record(kind: str, t0: float, t1: float, status: str = "ok", **extra) -> dict:
    return {"kind": kind, "variant": "0", "phase": "load", "t0": t0, "t1": t1,
            "status": status, **extra}


def clean_run() -> dict:
    """60 s of load: every kind answered, one replica of the LLM killed at 30 s and back
    at 36 s, a drain at 60 s that ends well."""
    records = [record(kind, t, t + 2.0) for t in range(0, 58, 4)
               for kind in ("chat", "chat_audio", "speech", "transcription", "image",
                            "video")]
    return {
        "records": records,
        "kills": [{"t": 30.0, "pid": 4242, "stage": ["assistant", "llm"], "back": 36.0}],
        "samples": [sample(t) for t in range(0, 60, 3)],
        "drain": {"t_term": 60.0, "exit_s": 20.0, "limit_s": 45.0, "exit_code": 0,
                  "processes_left": [], "shm_left": {"shm_files": 0, "shm_bytes": 0},
                  "mapped_shm_left": [], "in_flight_after_probes": True,
                  "probes": [{"kind": k, "status": "typed", "code": "shutting_down",
                              "detail": "HTTP 503: the server is shutting down"}
                             for k in ("chat", "image")]},
        "videos_left": [{"id": "video_1", "status": "completed"}],
        "liveness": {"deaths": 1, "slow_heartbeats": 2, "restarts": 1,
                     "down": ["ERROR replica llm/0 is down: process 4242 killed by SIGKILL"]},
    }


def judged(r: dict, **overrides) -> dict:
    return soak_report.verdict(r, args(**overrides))


def test_a_clean_run_passes():
    verdict = judged(clean_run())
    assert verdict["pass"], verdict["reasons"]
    assert verdict["per_kind"]["chat"]["ok"] == 15


def test_failures_the_run_explains_still_pass():
    r = clean_run()
    r["records"] += [
        # typed, during the LLM's outage (30 s .. back at 36 s, + 5 s of grace)
        record("chat", 33.0, 34.0, "typed", code="replica_died", detail="llm died"),
        record("chat_audio", 40.0, 41.0, "typed", code="replica_died", detail="llm died"),
        # in flight at SIGTERM, aborted only past the drain timeout (30 s)
        record("speech", 59.0, 89.5, "typed", code="aborted", detail="aborted"),
        # a video job whose polling outlived the server: judged by its stored record
        record("video", 59.0, 79.5, "untyped", detail="connection refused"),
    ]
    verdict = judged(r)
    assert verdict["pass"], verdict["reasons"]
    assert verdict["per_kind"]["video"]["cut"] == 1


def _hung(r):
    r["records"].append(record("speech", 10.0, 130.0, "hung", detail="no byte in 90 s"))


def _wrong(r):
    r["records"].append(record("chat", 10.0, 11.0, "wrong", detail="text differs"))


def _untyped(r):
    r["records"].append(record("image", 10.0, 11.0, "untyped", detail="ConnectionReset"))


def _typed_far_from_kills(r):
    r["records"].append(record("chat", 10.0, 11.0, "typed", code="x", detail="failed"))


def _typed_of_another_stage(r):  # the LLM was killed: a transcription never runs on it
    r["records"].append(record("transcription", 33.0, 34.0, "typed", code="x", detail="?"))


def _aborted_before_the_drain_timeout(r):
    r["records"].append(record("chat", 59.0, 70.0, "typed", code="aborted", detail="?"))


def _pss_grows(r):
    r["samples"] = [sample(t, pss=1e9 * (1 + t / 300)) for t in range(0, 60, 3)]


def _fds_grow(r):
    r["samples"] = [sample(t, fds=400 + t) for t in range(0, 60, 3)]


def _too_few_samples(r):
    r["samples"] = [sample(t, all_up=t > 54) for t in range(0, 60, 3)]


def _never_back(r):
    del r["kills"][0]["back"]


def _no_kill(r):
    r["kills"] = []


def _exit_code(r):
    r["drain"]["exit_code"] = None


def _processes_left(r):
    r["drain"]["processes_left"] = [4243]


def _shm_left(r):
    r["drain"]["shm_left"] = {"shm_files": 2, "shm_bytes": 4096}


def _probe_served(r):
    r["drain"]["probes"][0] = {"kind": "chat", "status": "ok", "detail": "HTTP 200"}


def _video_lost(r):
    r["videos_left"] = [{"id": "video_1", "status": "failed", "error": "aborted"}]


def _false_death(r):  # busy, not gone: issue 43
    r["liveness"]["deaths"] += 1
    r["liveness"]["down"].append("ERROR replica tts/0 is down: no heartbeat for 6.5 s")


@pytest.mark.parametrize(("spoil", "reason"), [
    (_hung, "1 hung"), (_wrong, "1 wrong"), (_untyped, "1 untyped"),
    (_typed_far_from_kills, "typed failures far from any kill"),
    (_typed_of_another_stage, "typed failures far from any kill"),
    (_aborted_before_the_drain_timeout, "typed failures far from any kill"),
    (_pss_grows, "pss_bytes changed"), (_fds_grow, "fds changed"),
    (_too_few_samples, "too few to judge growth"), (_never_back, "never came back"),
    (_no_kill, "no replica was killed"), (_exit_code, "exit code was None"),
    (_processes_left, "processes left"), (_shm_left, "/dev/shm blocks left"),
    (_probe_served, "want 503 shutting_down"), (_video_lost, "ended failed"),
    (_false_death, "1 replica deaths that no kill explains (e.g. ERROR replica tts/0"),
], ids=lambda v: v.__name__.strip("_") if callable(v) else None)
def test_each_way_to_fail_fails(spoil, reason):
    r = copy.deepcopy(clean_run())
    spoil(r)
    verdict = judged(r)
    assert not verdict["pass"]
    assert any(reason in text for text in verdict["reasons"]), verdict["reasons"]


def test_answers_against_their_reference_at_the_default_audio_tolerance():
    tolerance = args().audio_tolerance
    s = Settings()
    speech = {"pcm_bytes": 100_000, "duration_s": 2.0}

    def audio(factor: float) -> dict:
        return {"pcm_bytes": int(100_000 * factor), "duration_s": 2.0 * factor}
    assert soak_report.compare("speech", audio(1 + tolerance - 0.01), speech, s,
                               tolerance) is None
    assert soak_report.compare("speech", audio(1 - tolerance + 0.01), speech, s,
                               tolerance) is None
    assert "beyond" in soak_report.compare("speech", audio(1 + tolerance + 0.01), speech, s,
                                           tolerance)
    assert "beyond" in soak_report.compare("speech", audio(1 - tolerance - 0.01), speech, s,
                                           tolerance)
    spread = {**speech, "pcm_bytes_runs": [90_000, 100_000, 110_000],  # runs alone
              "duration_s_runs": [1.8, 2.0, 2.2]}
    assert soak_report.compare("speech", audio(1.1 * (1 + tolerance) - 0.01), spread, s,
                               tolerance) is None
    assert "runs alone 90000..110000" in soak_report.compare(
        "speech", audio(1.1 * (1 + tolerance) + 0.01), spread, s, tolerance)
    assert "beyond" in soak_report.compare("speech", audio(0.9 * (1 - tolerance) - 0.01),
                                           spread, s, tolerance)
    assert soak_report.compare("chat", {"text": "Blue."}, {"text": "Red."}, s, tolerance)
    assert soak_report.compare("image", {"size": "64x64"}, {}, s, tolerance)
    assert soak_report.compare("image", {"size": s.image_size}, {}, s, tolerance) is None
    assert soak_report.compare("video", {"size": s.video_size, "frames": 9}, {}, s,
                               tolerance)


def test_spoken_answers_must_equal_runs_alone_that_were_equal_sample_for_sample():
    from bench.soak import _median_of

    s, tolerance = Settings(), args().audio_tolerance
    run = {"text": "Blue.", "pcm_bytes": 100_000, "audio_sha": "a"}
    same = _median_of([run, dict(run), dict(run)])
    assert same["audio_sha"] == "a"
    assert soak_report.compare("chat_audio", dict(run), same, s, tolerance) is None
    other = {**run, "audio_sha": "b"}  # the same length, other samples: wrong
    assert "equal sample for sample" in soak_report.compare("chat_audio", other, same, s,
                                                            tolerance)
    # runs alone that differ (a voice with its noise): only the duration band is left
    mixed = _median_of([run, {**run, "audio_sha": "c"}, dict(run)])
    assert mixed["audio_sha"] is None
    assert soak_report.compare("chat_audio", other, mixed, s, tolerance) is None


def test_a_wrong_answer_says_where_its_audio_parts():
    from bench.soak_workload import first_difference

    assert first_difference(b"abcd", b"abcd") == "audio bytes equal"
    assert first_difference(b"abXd", b"abcd") == "audio first differs at byte 2 of 4"
    assert first_difference(b"abcdef", b"abcd") == "audio equal for 4 bytes, then one ends"


def test_the_docs_state_the_default_audio_tolerance():
    percent = round(args().audio_tolerance * 100)
    row = next(line for line in DOC.read_text().splitlines()
               if line.startswith("| no wrong answer"))
    stated = re.search(r"`--audio-tolerance` \((\d+) %\)", row)
    assert stated and int(stated.group(1)) == percent, row[:300]
