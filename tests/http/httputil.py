"""Helpers for the HTTP tests: a real aiohttp server on loopback, run on its own
event-loop thread, with echo-engine pipelines behind it.

Each test module starts the servers it needs once (module scope) and talks to them with
the unmodified openai SDK or raw aiohttp, from the test thread via ``run(coro)``.
Server-side state (orchestrator requests, replica sets) is read on the server's own loop
through ``Server.call`` so the tests never race the loop they observe.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import aiohttp  # noqa: E402
import openai  # noqa: E402
from aiohttp import web  # noqa: E402

from omni.api.app import build_app  # noqa: E402
from omni.api.state import ServedModel, ServerSettings  # noqa: E402
from omni.config.presets import load_pipeline  # noqa: E402
from omni.runtime.async_omni import AsyncOmni  # noqa: E402
from omni.runtime.metrics import Metrics  # noqa: E402

START_TIMEOUT_S = 60.0


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run one async test body on a fresh loop in the test thread (no pytest-asyncio)."""
    return asyncio.run(coro)


def write_pipeline(directory: Path, name: str, yaml_text: str) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    return path


def one_stage(name: str, *, options: str = "{}", params: str = "{}", final: str = "text",
              max_inflight: int = 256, request_timeout_s: float = 60) -> str:
    """YAML of a one-stage echo pipeline."""
    return textwrap.dedent(f"""\
        name: {name}
        max_inflight: {max_inflight}
        request_timeout_s: {request_timeout_s}
        stages:
          - name: stage
            engine: echo
            options: {options}
            params: {params}
            final_output: {final}
        """)


class Server:
    """An omni HTTP server on 127.0.0.1:<free port>, served from a background loop thread."""

    def __init__(self, pipelines: dict[str, str | Path],
                 settings: ServerSettings | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.pipelines = pipelines
        self.start_timeout_s = start_timeout_s
        # a short drain keeps teardown quick even if a test leaves a request behind
        self.settings = settings or ServerSettings(drain_timeout_s=2.0)
        self.metrics = Metrics()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="omni-test-server")
        self.models: dict[str, ServedModel] = {}
        self.runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> Server:
        self.thread.start()
        try:
            self.call(self._start(), timeout=self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def served(self) -> list[ServedModel]:
        """The models to serve (a subclass may build them as omni.server does, from flags)."""
        models = []
        for served_name, target in self.pipelines.items():
            pipeline = load_pipeline(str(target), served_name)
            omni = AsyncOmni(pipeline, metrics=self.metrics, drain_timeout_s=1.0)
            models.append(ServedModel(served_name, omni, metadata={"test": True}))
            models += [ServedModel(view, omni.view(view), metadata={"test": True})
                       for view in pipeline.views]  # as omni.server serves them
        return models

    async def _start(self) -> None:
        models = self.served()
        self.models = {m.id: m for m in models}
        app = build_app(models, self.metrics, self.settings)
        self.runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                    shutdown_timeout=2.0)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def stop(self) -> None:
        if self.loop.is_running():
            if self.runner is not None:
                try:
                    self.call(self.runner.cleanup(), timeout=30.0)
                except Exception:  # noqa: BLE001 - teardown must finish
                    self._kill_engines()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10.0)
        if not self.loop.is_running():
            self.loop.close()

    def _kill_engines(self) -> None:
        """Last resort: SIGKILL the engine processes this server spawned (by their pid),
        so multiprocessing's exit hook does not wait on them forever."""
        for model in self.models.values():  # a view shares its pipeline's replicas
            for replica in model.omni.orchestrator.engines.replicas.values():
                if replica.process.is_alive():
                    replica.process.kill()

    # -- helpers -----------------------------------------------------------------------
    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def inspect(self, fn: Callable[[], Any]) -> Any:
        """Evaluate fn() on the server's loop (consistent view of orchestrator state)."""
        async def wrapper() -> Any:
            return fn()
        return self.call(wrapper())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, api_key: str = "x", **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 20.0)
        # the SDK's defaults without its own wrapper: a client a test leaves unclosed is
        # collected later, and the wrapper's __del__ then schedules aclose() on whatever
        # loop runs at that moment (another test's), where it fails with "Event loop is
        # closed" and trips that test's loop-error check (test_wire_robustness, one CI run)
        kwargs.setdefault("http_client", openai.DefaultAsyncHttpxClient())
        return openai.AsyncOpenAI(base_url=self.base_url, api_key=api_key, **kwargs)

    def session(self, **kwargs: Any) -> aiohttp.ClientSession:
        kwargs.setdefault("timeout", aiohttp.ClientTimeout(total=20.0))
        return aiohttp.ClientSession(base_url=self.url, **kwargs)

    def in_flight(self, model: str) -> dict[str, Any]:
        """Requests in the orchestrator and ids outstanding on each replica, for a model."""
        orch = self.models[model].omni.orchestrator
        return self.inspect(lambda: {
            "requests": list(orch.requests),
            "outstanding": {rid: sorted(r.outstanding)
                            for rid, r in orch.engines.replicas.items()},
        })

    async def wait_idle(self, model: str, timeout_s: float = 2.0) -> dict[str, Any]:
        """Poll (short awaits, bounded) until the model has nothing in flight anywhere."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            state = self.in_flight(model)
            idle = not state["requests"] and not any(state["outstanding"].values())
            if idle or asyncio.get_running_loop().time() > deadline:
                return state
            await asyncio.sleep(0.05)


# -- the shared server ---------------------------------------------------------------------
# One server for most HTTP tests (session scope: engines start once). Each pipeline is
# built for one family of checks, so tests on one cannot disturb another.
MAIN_PIPELINES = {
    "echo": "echo",              # preset: one echo stage, text out
    "chain": "echo_chain",       # preset: a -> b -> c (text), a -> side (audio)
    # several text pieces per request, so a stream has several content deltas
    "streamy": one_stage("streamy", params="{chunks: 4}"),
    # a pipeline whose only output is audio: chat/completions must refuse it
    "speech": one_stage("speech", final="audio"),
    # fails at its first step, before any output: a 500 error object, not a stream
    "fail": one_stage("fail", params="{echo_fail: step, echo_fail_stage: stage, chunks: 3}"),
    # t1 streams text and finishes, then t2 (also a text final) fails: an error after
    # the 200 has gone out, which can only travel as an SSE error event
    "midfail": textwrap.dedent("""\
        name: midfail
        request_timeout_s: 60
        stages:
          - {name: t1, engine: echo, params: {chunks: 3}, final_output: text}
          - {name: t2, engine: echo, params: {echo_fail: step, echo_fail_stage: t2},
             final_output: text}
        edges:
          - {from: t1, to: t2}
        """),
    # slow: 40 steps of 100 ms (4 s), for client-disconnect aborts
    "slow": one_stage("slow", options="{chunks: 40, delay_ms: 100}"),
    # admission: one request at a time, each about 1 s
    "single": one_stage("single", options="{chunks: 5, delay_ms: 200}", max_inflight=1),
}
MAIN_MAX_REQUEST_BYTES = 1024


def assert_error_object(body: Any, *, type_: str | None = None, param: Any = ...,
                        code: Any = ...) -> dict[str, Any]:
    """The OpenAI error shape: {"error": {message, type, param, code}} and nothing less."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if type_ is not None:
        assert error["type"] == type_, error
    if param is not ...:
        assert error["param"] == param, error
    if code is not ...:
        assert error["code"] == code, error
    return error


def parse_sse(raw: bytes) -> list[Any]:
    """The data payloads of an SSE body, JSON-decoded; '[DONE]' stays a string."""
    import json

    events = []
    for block in raw.decode().split("\n\n"):
        data = [line[5:].lstrip() for line in block.splitlines() if line.startswith("data:")]
        if data:
            payload = "\n".join(data)
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
