"""The playground's Images and Video tabs in a real headless Chromium, against `python -m
omni.server --api-key ...` serving the tiny random Qwen-Image and Wan (and the echo
pipeline, a text model for a realtime session): the page itself loads without the key,
asks for it once (a wrong one gets the API's own message), and every call it makes carries
it, the realtime WebSocket's as its subprotocol; the picture and the video appear, and
progress was shown.
"""

from __future__ import annotations

import pytest
from browserutil import Page, artefact_dir, launch, requirement
from test_server_e2e import Server

from omni.fixtures.tiny_models import ensure_tiny_model

pytestmark = requirement()
KEY = "playground-key"
UNAUTHORIZED = "status of 401"  # Chromium's console line for the page's first, keyless call


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"  # shared with the other tiny-model tests
    srv = Server("--model", str(ensure_tiny_model("qwen_image", cache)),
                 "--model", str(ensure_tiny_model("wan_t2v", cache)),
                 "--pipeline", "echo",  # a text model: a realtime session with the key
                 "--data-dir", str(tmp_path_factory.mktemp("videos")), "--api-key", KEY)
    try:
        srv.wait_listening(timeout=120)
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        tab = Page(browser, server.url(""), artefact_dir(tmp_path_factory))
        yield tab
        tab.close()
        browser.close()
    errors = [e for e in tab.errors if UNAUTHORIZED not in e]
    assert errors == [], errors


def test_the_page_loads_without_the_key_and_asks_for_it_once(page):
    page.open()
    assert page.page.is_visible("#key-form") and page.page.is_hidden("#tabs")
    page.page.fill("#key-input", "not-the-key")
    page.page.click("#key-form button")
    page.wait("!document.getElementById('key-error').hidden", 10)
    assert "invalid or missing API key" in page.page.inner_text("#key-error")  # the API's
    page.page.fill("#key-input", KEY)
    page.page.press("#key-input", "Enter")
    page.wait("!document.getElementById('tabs').hidden", 10)
    assert page.page.is_hidden("#key-form")
    visible = page.js("[...document.querySelectorAll('[role=tab]')]"
                      ".filter(t => !t.hidden).map(t => t.dataset.tab)")
    assert visible == ["talk", "chat", "images", "video"]
    page.page.reload()  # asked once: the key stays for this tab
    page.wait("window.omniUi.ready && !document.getElementById('tabs').hidden", 10)
    assert page.page.is_hidden("#key-form")


def test_a_realtime_session_carries_the_key_as_its_subprotocol(page):
    page.tab("talk")
    assert page.page.input_value("#talk-model") == "echo"
    assert page.page.is_hidden("#talk-mic")  # echo does not hear: typed turns only
    page.page.fill("#talk-text", "hello over the socket")
    page.page.press("#talk-text", "Enter")
    page.wait("(document.querySelector('#talk-log .msg.assistant .text') || {})"
              ".textContent === 'hello over the socket'", 30)
    assert page.page.inner_text("#talk-state") == "Connected"


def test_images_show_progress_then_the_picture(page):
    page.tab("images")
    page.watch_text("#images-state")
    page.page.fill("#images-size", "32x32")
    page.page.fill("#images-steps", "3")
    page.page.fill("#images-seed", "1")
    page.page.click("#images-go")
    page.wait("document.getElementById('images-state').textContent.startsWith('Done')", 60)
    assert any(s.startswith("Preview") for s in page.seen("#images-state")), \
        page.seen("#images-state")
    size = page.js("[document.getElementById('images-result').naturalWidth, "
                   "document.getElementById('images-result').naturalHeight]")
    assert size == [32, 32]
    distinct = page.js("""(() => {
        const img = document.getElementById('images-result');
        const canvas = document.createElement('canvas');
        canvas.width = canvas.height = 32;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(img, 0, 0);
        const data = ctx.getImageData(0, 0, 32, 32).data;
        return new Set(Array.from(data).filter((_, i) => i % 4 === 0)).size;
    })()""")
    assert distinct > 8, "the picture is flat"  # random weights still give varied pixels
    page.shot("images")


def test_video_job_shows_progress_then_plays_inline(page):
    page.tab("video")
    page.watch_text("#video-state")
    page.page.fill("#video-size", "32x32")
    page.page.fill("#video-seconds", "1")
    page.page.fill("#video-steps", "2")
    page.page.click("#video-go")
    page.wait("document.getElementById('video-state').textContent === 'Done'", 90)
    seen = page.seen("#video-state")
    assert "Queued" in seen or any(s.endswith("%") for s in seen), seen
    page.wait("document.getElementById('video-player').readyState >= 2", 20)
    assert page.js("document.getElementById('video-player').videoWidth") == 32
    page.shot("video")
