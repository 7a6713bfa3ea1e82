"""SIGTERM with requests that cannot finish within --drain-timeout: at the deadline they
end with a typed error (a streamed chat gets an SSE error event, a plain one a 503, both
`server_stopped`), and the whole process tree is gone shortly after, not seconds later.
Before, the drain only logged "aborting": the requests ran on until aiohttp's shutdown
cut their connections (2 x its 5 s shutdown timeout), so `--drain-timeout 2` exited after
~12 s and the clients saw a dropped connection instead of an error."""

from __future__ import annotations

import glob
import os
import re
import signal
import textwrap
import threading
import time
from typing import Any

import openai
import pytest
from test_server_e2e import Server, _get

DRAIN_S = 3.0
MARGIN_S = 2.5  # engine shutdown and a loaded 2-core machine; well below a second drain
# an echo step every 0.4 s, 150 chunks: a minute, far beyond the drain
SLOW = """\
    name: slow
    stages:
      - {name: echo, engine: echo, devices: [cpu], final_output: text,
         options: {delay_ms: 400, chunks: 150}}
    """
PROMPT = " ".join(f"word{i}" for i in range(120))


def _stream(client: openai.OpenAI, seen: threading.Event, result: dict[str, Any]) -> None:
    stream = client.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": PROMPT}], stream=True)
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                result.setdefault("text", chunk.choices[0].delta.content)
                seen.set()
    except openai.APIError as exc:
        result["error"] = exc
    result["ended"] = time.monotonic()


def _plain(client: openai.OpenAI, result: dict[str, Any]) -> None:
    try:
        client.chat.completions.create(model="slow",
                                       messages=[{"role": "user", "content": PROMPT}])
    except openai.APIError as exc:
        result["error"] = exc
    result["ended"] = time.monotonic()


def _in_flight(server: Server, count: int) -> None:
    deadline = time.monotonic() + 30
    while _get(server.url("/health"))[1]["models"]["slow"]["in_flight"] < count:
        assert time.monotonic() < deadline, "the requests never reached the engine"
        time.sleep(0.02)


@pytest.mark.timeout(90)
def test_requests_past_the_drain_deadline_end_typed_and_the_tree_exits(tmp_path):
    pipeline = tmp_path / "slow.yaml"
    pipeline.write_text(textwrap.dedent(SLOW))
    server = Server("--pipeline", str(pipeline), "--no-ui", "--drain-timeout", str(DRAIN_S),
                    env={"OMP_NUM_THREADS": "1"})
    try:
        server.wait_listening(timeout=60)
        engines = [int(pid) for pid in re.findall(r"ready \(pid (\d+)", server.log())]
        client = openai.OpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
        streamed, plain, seen = {}, {}, threading.Event()
        threads = [threading.Thread(target=_stream, args=(client, seen, streamed)),
                   threading.Thread(target=_plain, args=(client, plain))]
        for thread in threads:
            thread.start()
        assert seen.wait(30), "the stream never started"
        _in_flight(server, 2)
        server.proc.send_signal(signal.SIGTERM)
        sigterm = time.monotonic()
        assert server.proc.wait(DRAIN_S + 30) == 0, server.log()
        exit_s = time.monotonic() - sigterm
        for thread in threads:
            thread.join(10)
    finally:
        server.stop()
    print(f"\ndrain {DRAIN_S:g} s: exit after {exit_s:.2f} s, stream error after "
          f"{streamed['ended'] - sigterm:.2f} s, plain after {plain['ended'] - sigterm:.2f} s")
    assert streamed["text"].startswith("word0")  # it was producing: its first piece
    assert exit_s < DRAIN_S + MARGIN_S, server.log()
    for result in (streamed, plain):
        error = result["error"]
        assert error.code == "server_stopped" and "drain deadline" in error.message, error
        assert DRAIN_S - 0.5 < result["ended"] - sigterm < DRAIN_S + MARGIN_S
    assert isinstance(plain["error"], openai.InternalServerError)
    assert plain["error"].status_code == 503
    log = server.log()
    assert "leaked" not in log, log
    assert not [pid for pid in engines if _alive(pid)], "an engine outlived the server"
    assert not glob.glob(f"/dev/shm/omni-{server.proc.pid}-*")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
