"""tests/distributed: network namespaces as hosts (bench/netns/). They skip where
namespaces cannot be made (not root, no iproute2) or Ray is missing. With
OMNI_REQUIRE_DISTRIBUTED=1 (.ci/run sets it: CI runs as root) such a skip is a failure,
so a CI run in which these tests did not run cannot pass."""

from __future__ import annotations

import os

import pytest

REQUIRED = os.environ.get("OMNI_REQUIRE_DISTRIBUTED") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"OMNI_REQUIRE_DISTRIBUTED=1, but {item.nodeid} was skipped: "
                           f"{reason}")
