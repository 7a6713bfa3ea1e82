"""Headless Chromium for the playground tests: Debian's ``chromium`` driven by Playwright
for Python through ``executable_path`` (Playwright's own browser downloads are never used),
with Chromium's fake microphone playing a WAV file. scripts/install_browser.sh installs
both; CI sets OMNI_REQUIRE_BROWSER=1, so there a missing browser fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("OMNI_CHROMIUM", "/usr/bin/chromium")


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (bash scripts/install_browser.sh)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (bash scripts/install_browser.sh)"
    return None


def requirement() -> pytest.MarkDecorator:
    """Skip without a browser, unless CI requires one (then the fixture fails, loudly)."""
    reason = missing()
    required = os.environ.get("OMNI_REQUIRE_BROWSER") == "1"
    return pytest.mark.skipif(bool(reason) and not required, reason=reason or "")


def artefact_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $OMNI_TEST_ARTEFACTS (kept by CI) or the tests' temp dir."""
    chosen = os.environ.get("OMNI_TEST_ARTEFACTS")
    path = Path(chosen) / "playground" if chosen else tmp_path_factory.mktemp("playground")
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch(playwright: Any, fake_microphone: Path | None = None) -> Any:
    reason = missing()
    if reason:
        pytest.fail(reason)
    args = ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            "--autoplay-policy=no-user-gesture-required"]
    if os.geteuid() == 0:  # CI runs as root, where Chromium's sandbox cannot start
        args.append("--no-sandbox")
    if fake_microphone is not None:  # %noloop: said once, then silence
        args.append(f"--use-file-for-fake-audio-capture={fake_microphone}%noloop")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=args)


class Page:
    """One tab of the playground, with its console errors collected."""

    def __init__(self, browser: Any, base_url: str, shots: Path,
                 viewport: tuple[int, int] = (1100, 860)) -> None:
        self.context = browser.new_context(viewport={"width": viewport[0],
                                                     "height": viewport[1]},
                                           accept_downloads=True)
        self.page = self.context.new_page()
        self.base_url, self.shots = base_url, shots
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def open(self, path: str = "/") -> Page:
        self.page.goto(self.base_url + path)
        self.wait("window.omniUi && window.omniUi.ready", 30)
        return self

    def js(self, expression: str) -> Any:
        # page.evaluate runs through the DevTools protocol, which the page's
        # Content-Security-Policy (no eval) does not block; wait_for_function would
        return self.page.evaluate(expression)

    def wait(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Until ``expression`` is truthy in the page (checked every 0.2 s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.2)
        self.shot("timeout")
        raise AssertionError(f"the page never got to: {expression}\nerrors: {self.errors}\n"
                             + self.page.inner_text("main")[:2000])

    def watch_text(self, selector: str) -> None:
        """Record every text ``selector`` shows (window.seen[selector]): progress that
        comes and goes between two checks is still seen."""
        self.js(f"""(() => {{
            const node = document.querySelector({selector!r});
            window.seen = window.seen || {{}};
            const seen = window.seen[{selector!r}] = [];
            new MutationObserver(() => seen.push(node.textContent)).observe(
                node, {{childList: true, characterData: true, subtree: true}});
        }})()""")

    def seen(self, selector: str) -> list[str]:
        return self.js(f"window.seen[{selector!r}]")

    def tab(self, name: str) -> None:
        self.page.click(f"#tab-{name}")
        self.wait(f"!document.getElementById('panel-{name}').hidden", 5)

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()
