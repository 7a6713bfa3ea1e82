"""The diffusion engine shares a transformer call only where its own timed calls say it
pays (omni/engines/diffusion/rows.py): the policy on recorded device times, then the
engine on the tiny Qwen-Image pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from unit.diffusion_runs import engine, run

from omni.engines.base import EngineLoadError
from omni.engines.diffusion.engine import DiffusionEngine
from omni.engines.diffusion.rows import KEPT, MAX_SIZES, RECHECK_EVERY, Finish, RowPolicy

KEY = (16, 4, 4)


def timed(policy: RowPolicy, rows: int, *seconds: float) -> None:
    for s in seconds:
        policy.record(KEY, rows, s)


def test_a_lone_call_is_timed_first_then_the_shared_one():
    policy = RowPolicy(0.1)
    sizes = [2, 4, 6, 8]  # four guided jobs: two rows each
    assert policy.jobs_to_run(KEY, sizes) == 1
    timed(policy, 2, 1.0)
    assert policy.jobs_to_run(KEY, sizes) == 1  # one time is not yet a measurement
    timed(policy, 2, 1.2)
    assert policy.jobs_to_run(KEY, sizes) == 4  # the whole call, to time it
    timed(policy, 8, 2.0)
    assert policy.jobs_to_run(KEY, sizes) == 4
    timed(policy, 8, 2.1)
    assert policy.seconds(KEY, 8) == 2.0 and policy.seconds(KEY, 2) == 1.0  # the fastest
    assert policy.jobs_to_run(KEY, sizes) == 4  # 4 rows/s vs 2: it pays


def test_a_call_that_gains_too_little_is_not_shared(caplog):
    caplog.set_level("INFO", logger="omni.engine.diffusion")
    policy = RowPolicy(0.1)
    timed(policy, 2, 1.0, 1.0)
    timed(policy, 8, 3.9, 3.95)  # +2.6 %: what FLUX.2-dev gained on an H100
    assert policy.jobs_to_run(KEY, [2, 4, 6, 8]) == 1
    assert policy.jobs_to_run(KEY, [2, 4, 6, 8]) == 1
    told = [r.getMessage() for r in caplog.records]
    assert told == ["shape (16, 4, 4): one request at a time (a lone call of 2 rows in "
                    "1000.0 ms = 2.0 rows/s; 8 rows in 3900.0 ms = 2.1 rows/s; "
                    "batch_gain 0.10)"], told  # said once, with what it rests on
    # fewer rows than a call that did not pay are not explored
    assert policy.jobs_to_run(KEY, [2, 4, 6]) == 1
    # until, every RECHECK_EVERY-th call run alone, one is shared to time it again
    choices = [policy.jobs_to_run(KEY, [2, 4, 6, 8]) for _ in range(RECHECK_EVERY)]
    assert choices.count(4) == 1 and set(choices) == {1, 4}
    timed(policy, 8, 1.9)  # this time the shared call paid: from now on it is shared
    assert policy.jobs_to_run(KEY, [2, 4, 6, 8]) == 4
    timed(policy, 8, *[3.9] * KEPT)  # only the last KEPT times count: it does not pay again
    assert policy.jobs_to_run(KEY, [2, 4, 6, 8]) == 1
    # the largest prefix that pays runs: 4 rows measured at +60 %, 6 unmeasured
    timed(policy, 4, 1.25, 1.3)
    assert policy.jobs_to_run(KEY, [2, 4, 6, 8]) == 2
    assert "requests share calls" in caplog.records[-1].getMessage()
    # other shapes are measured apart
    assert policy.jobs_to_run((16, 8, 8), [2, 4]) == 1


def test_a_shared_decode_counts_where_the_jobs_finish_together(caplog):
    """What the dev VM measured on a tiny 512x512 fixture: 4 rows a transformer call gained
    7 %, 4 images a decode 25 %. Alone the call does not pay; with the decode spread over
    the steps left it does, for jobs that would finish together (a burst at one step)."""
    caplog.set_level("INFO", logger="omni.engine.diffusion")
    policy = RowPolicy(0.1)
    timed(policy, 1, 0.0104, 0.0104)
    timed(policy, 4, 0.039, 0.039)
    sizes = [1, 2, 3, 4]
    burst = Finish(KEY, 8, (1, 2, 3, 4))
    assert policy.jobs_to_run(KEY, sizes) == 1  # the transformer alone: 7 %
    # the lone decode timed, four together not yet: shared to the end, to time their decode
    policy.record(("decode", KEY), 1, 0.4)
    policy.record(("decode", KEY), 1, 0.4)
    assert policy.jobs_to_run(KEY, sizes, burst) == 4
    policy.record(("decode", KEY), 4, 1.08)
    policy.record(("decode", KEY), 4, 1.1)
    # (8 x 10.4 + 400) ms a row alone vs (8 x 39 + 1080) / 4 ms: +39 %
    assert policy.jobs_to_run(KEY, sizes, burst) == 4
    told = [r.getMessage() for r in caplog.records]
    assert told[-1].startswith("shape (16, 4, 4): requests share calls"), told
    assert told[-1].endswith("; decodes of 1 and 4 images in 400.0 and 1080.0 ms over 8 "
                             "steps; batch_gain 0.10)"), told
    # jobs at different steps finish apart: the transformer alone decides
    assert policy.jobs_to_run(KEY, sizes, Finish(KEY, 8, (1,))) == 1
    assert policy.jobs_to_run(KEY, sizes) == 1
    # a decode that gains little leaves them one at a time, and fewer are not explored
    slow = RowPolicy(0.1)
    timed(slow, 1, 0.0104, 0.0104)
    timed(slow, 4, 0.039, 0.039)
    for rows, took in ((1, 0.4), (1, 0.4), (4, 1.58), (4, 1.6)):
        slow.record(("decode", KEY), rows, took)
    assert slow.jobs_to_run(KEY, sizes, burst) == 1
    assert slow.jobs_to_run(KEY, sizes[:3], Finish(KEY, 8, (1, 2, 3))) == 1


def test_the_engine_times_its_decodes_by_images():
    policy = RowPolicy(0.1)
    policy.stop_decode(policy.start(), KEY, 2)
    assert len(policy._times[("decode", KEY), 2]) == 1 and policy.seconds(KEY, 2) is None


def test_gain_zero_always_shares_and_times_nothing():
    policy = RowPolicy(0)
    assert policy.jobs_to_run(KEY, [1, 2, 3]) == 3
    assert policy.start() is None
    policy.stop(policy.start(), KEY, 3)
    assert policy.seconds(KEY, 3) is None


def test_what_is_kept_stays_bounded():
    policy = RowPolicy(0.1)
    for shape in range(MAX_SIZES + 40):
        policy.record(("shape", shape), 1, 0.5)
    timed(policy, 2, *[1.0] * (KEPT + 5))
    assert len(policy._times) == MAX_SIZES and len(policy._times[(KEY, 2)]) == KEPT
    assert policy.seconds(("shape", 0), 1) is None  # the oldest shapes went first
    policy.record(["unhashable", 1], 1, 0.1)  # a key that is a list still counts
    policy.record(["unhashable", 1], 1, 0.2)
    assert policy.seconds(["unhashable", 1], 1) == 0.1


def test_the_option_is_checked(models):
    eng = engine(models, "qwen_image", "qwen_image", batch_gain=0.25)
    assert eng.info()["batch_gain"] == 0.25
    for bad in (-1, "fast", True, 11):
        with pytest.raises(EngineLoadError, match="batch_gain"):
            DiffusionEngine(eng.denoiser, {"batch_gain": bad})


def test_the_engine_times_its_calls_and_answers_as_when_always_sharing(models):
    """Three requests at once: the oldest runs alone while a lone call is measured, then
    all three share one call to time it; the pixels equal an always-sharing engine's."""
    requests = [(f"r{i}", {"prompt": f"a fox number {i}"},
                 {"size": "32x32", "steps": 6, "seed": i}) for i in range(3)]
    measured = engine(models, "qwen_image", "qwen_image", batch_gain=0.1)
    calls = []
    predict = measured.denoiser.predict
    measured.denoiser.predict = lambda jobs: calls.append(len(jobs)) or predict(jobs)
    results, errors = run(measured, requests, join_after=0)
    assert not errors and sorted(results) == ["r0", "r1", "r2"]
    assert calls[:4] == [1, 1, 3, 3], calls
    kept = {rows: len(times) for (key, rows), times in measured.rows._times.items()
            if key[0] != "decode"}  # the transformer's calls
    assert kept[1] >= 2 and kept[3] >= 2, kept
    decodes = {rows for (key, rows) in measured.rows._times if key[0] == "decode"}
    assert decodes and decodes <= {1, 2, 3}, decodes  # and its decodes, by images
    shared, errors = run(engine(models, "qwen_image", "qwen_image"), requests, join_after=0)
    assert not errors
    first = results["r0"]["images"].numpy().astype(int)
    assert len(np.unique(first)) > 8  # the fixture's pixels vary
    for rid in shared:
        ours, theirs = results[rid]["images"].numpy(), shared[rid]["images"].numpy()
        assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1, rid
