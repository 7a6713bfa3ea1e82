"""The public Python API: AsyncOmni for asyncio apps, Omni for scripts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from omni.config.pipeline import PipelineConfig
from omni.config.presets import load_pipeline
from omni.errors import RequestFailedError
from omni.runtime.client_payloads import ClientPayloads
from omni.runtime.metrics import Metrics
from omni.runtime.orchestrator import OmniOutput, Orchestrator
from omni.runtime.pipeline_sessions import PipelineSessions
from omni.runtime.policies import PolicyCalls
from omni.runtime.submitted import Submitted
from omni.session import Fence, Session
from omni.session.conversation import ConversationTurns
from omni.session.worlds import WorldSessions

Params = Mapping[str, Mapping[str, Any]]
# what a stage that picks the voice reports, for the stage that outputs the audio: its
# voices, or the limits of the reference clip it clones one from (speech_reference.py)
VOICE_KEYS = ("voices", "openai_voice_alias", "voice_clone")


class AsyncOmni:
    """One pipeline served from this process: engines start on `start()` / `async with`.

    ``params`` of `generate` maps a stage name (or ``"*"`` for every stage) to that
    stage's per-request parameters.
    """

    def __init__(self, pipeline: PipelineConfig | str | os.PathLike, *, dtype: str = "auto",
                 metrics: Metrics | None = None, drain_timeout_s: float = 30.0,
                 startup_timeout_s: float = 900.0, log_level: int = logging.INFO) -> None:
        if not isinstance(pipeline, PipelineConfig):
            pipeline = load_pipeline(pipeline)
        self.pipeline = pipeline
        self.drain_timeout_s = drain_timeout_s
        self.orchestrator = Orchestrator(pipeline, metrics=metrics, dtype=dtype,
                                         log_level=log_level, startup_timeout_s=startup_timeout_s)
        remote = self.orchestrator.engines.remote  # final outputs may come from other hosts
        encrypted = remote is not None and pipeline.cluster.encrypt_payloads
        self.payloads = ClientPayloads(f"{self.orchestrator.engines.arena_prefix}-client",
                                       {"curve": remote.keys.to_dict()} if encrypted else None)
        self.sessions = PipelineSessions(pipeline, self.orchestrator)
        self.conversations = ConversationTurns(self.sessions.manager, self.generate,
                                               self.orchestrator.abort)
        self.worlds = WorldSessions(self.sessions, self.generate, self.stage_info,
                                    pipeline.outputs.get("video", ()))
        self.policies = PolicyCalls(self.sessions, self.generate)

    @property
    def name(self) -> str:
        return self.pipeline.name

    async def start(self) -> AsyncOmni:
        await self.orchestrator.start()
        self.sessions.start()
        return self

    async def close(self, drain_timeout_s: float | None = None) -> None:
        timeout = self.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
        self.sessions.stop()
        await self.orchestrator.stop(timeout)
        self.payloads.close()

    async def __aenter__(self) -> AsyncOmni:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def view(self, name: str) -> OmniView:
        """One of the pipeline's views (omni/config/views.py), run on these engines."""
        return OmniView(self, name)

    async def generate(self, inputs: dict[str, Any], *, modalities: Iterable[str] | None = None,
                       params: Params | None = None, request_id: str | None = None,
                       timeout_s: float | None = None, view: str | None = None,
                       input_modalities: Iterable[str] | None = None,
                       session: Session | None = None) -> AsyncIterator[OmniOutput]:
        """Yield the request's outputs in order; the last one has ``finished=True``.

        ``input_modalities`` (e.g. ["text", "audio"]): what ``inputs`` hold; entry stages
        that take none of them are skipped (a text question skips a speech recognizer).
        Raises an `omni.errors.OmniError` subclass when the request fails. Leaving the
        loop early (break, cancellation, client disconnect) aborts it in every stage.
        ``session``: run it as a turn of that session (see `respond`).
        """
        async with contextlib.aclosing(self.submit(
                inputs, modalities=modalities, params=params, request_id=request_id,
                timeout_s=timeout_s, view=view, input_modalities=input_modalities,
                session=session)) as outputs:
            async for item in outputs:
                yield item

    def submit(self, inputs: dict[str, Any], *, modalities: Iterable[str] | None = None,
               params: Params | None = None, request_id: str | None = None,
               timeout_s: float | None = None, view: str | None = None,
               input_modalities: Iterable[str] | None = None,
               session: Session | None = None) -> Submitted:
        """`generate`'s request, admitted now rather than at the first read (a reader in
        another task would admit it only when that task runs: omni/runtime/submitted.py).
        Read it with ``async for``; close it (``contextlib.aclosing``) to abort it."""
        return Submitted(self, self.orchestrator.submit(
            inputs, modalities, params, request_id, timeout_s, view, input_modalities, session))

    def open_stream(self, inputs: dict[str, Any], *, modalities: Iterable[str],
                    input_modalities: Iterable[str], params: Params | None = None,
                    request_id: str | None = None, timeout_s: float | None = None,
                    view: str | None = None) -> InputStream:
        """A request whose input keeps coming (audio as it is spoken): admitted now, fed
        with `InputStream.feed`, read from `InputStream.outputs`, ended by ``last`` or
        `InputStream.aclose` (which aborts it wherever it still runs)."""
        state = self.orchestrator.submit(inputs, modalities, params, request_id, timeout_s,
                                         view, input_modalities, stream_input=True)
        return InputStream(self, state)

    async def _read(self, state: Any) -> AsyncIterator[OmniOutput]:
        """A submitted request's outputs; leaving early aborts it."""
        try:
            while True:
                item = await state.queue.get()
                if isinstance(item, Exception):
                    raise item
                try:
                    item.data = await self.payloads.take_async(item.data)
                except Exception as exc:  # e.g. its producer died and its arena is gone
                    raise RequestFailedError(f"output of stage '{item.stage}' could not be "
                                             f"read: {exc}", item.stage) from exc
                yield item
                if item.finished:
                    return
        finally:
            if not state.finished:
                self.orchestrator.abort(state.request_id, "the caller stopped reading")
            self._discard_unread(state.queue)

    def _discard_unread(self, queue: asyncio.Queue) -> None:
        """Give back payloads of outputs nobody read, if the request succeeded; after a
        failure its producers free them (see omni/wire/payloads.py on late releases)."""
        unread = []
        while not queue.empty():
            unread.append(queue.get_nowait())
        if any(isinstance(item, Exception) for item in unread):
            return
        for item in unread:
            self.payloads.discard(item.data)

    async def abort(self, request_id: str) -> bool:
        return self.orchestrator.abort(request_id)

    def feed(self, request_id: str, data: dict[str, Any], last: bool = False) -> None:
        """More input of a request opened with `open_stream` (e.g. {"audio": pcm16,
        "sample_rate": 16000}), to its entry stages; ``last`` ends it. RequestAbortedError
        once it is not in flight; InvalidInputError after ``last`` or for another request."""
        self.orchestrator.feed(request_id, data, last)

    # -- sessions (omni/session/, DESIGN.md §7) ----------------------------------------------
    def open_session(self, kind: str = "conversation",
                     params: dict[str, Any] | None = None) -> Session:
        """A new session; SessionCapacityError at once when the pipeline holds its
        ``sessions.max_sessions``."""
        return self.sessions.open(kind, params)

    def append(self, session_id: str, item: dict[str, Any],
               fence: Fence | None = None) -> None:
        """One input of the session's current turn (a conversation: a chat message)."""
        self.conversations.append(session_id, item, fence)

    def signal(self, session_id: str, kind: str, fence: Fence | None = None) -> Fence:
        """commit (the turn's input is complete), cancel / interrupt (stop the running
        response: its outputs no longer reach anyone), reset (forget the history and the
        engine state). Returns the session's new fence."""
        return self.conversations.signal(session_id, kind, fence)

    def close_session(self, session_id: str, reason: str = "closed by the client") -> bool:
        return self.conversations.close(session_id, reason)

    def respond(self, session_id: str, *, fence: Fence | None = None,
                modalities: Iterable[str] | None = None, params: Params | None = None,
                view: str | None = None, instructions: str | None = None,
                inputs: Mapping[str, Any] | None = None) -> AsyncIterator[OmniOutput]:
        """Answer the conversation so far as one turn of the session: its outputs, as
        `generate` yields them. The answer's text joins the history when the turn ends
        (the part produced so far, if it was cancelled). ``instructions``: a system
        message put first for this turn; ``inputs``: request inputs beside the history
        (``tools``). One response runs per session at a time."""
        return self.conversations.respond(session_id, fence=fence, modalities=modalities,
                                          params=params, view=view, instructions=instructions,
                                          inputs=inputs)

    # -- world sessions (omni/session/worlds.py) and robot policies (policies.py) ------------
    def open_world(self, image: bytes | np.ndarray, prompt: str, domain: str,
                   **defaults: Any) -> Session:
        """A new world session; ``defaults``: step params for every step (seed, steps,
        chunk_size, guidance_scale, view_point). SessionCapacityError when full."""
        return self.worlds.open(image, prompt, domain, **defaults)

    def world_step(self, session_id: str, actions: np.ndarray,
                   **params: Any) -> AsyncIterator[Any]:
        """The next chunk: progress outputs, then one with ``video`` uint8 (F, H, W, 3)."""
        return self.worlds.step(session_id, actions, **params)

    def reset_world(self, session_id: str) -> None:
        """Back to the first frame: the next step restarts the rollout from it."""
        self.worlds.reset(session_id)

    def open_robot(self, **params: Any) -> Session:
        """A session for one robot's episode; SessionCapacityError when full."""
        return self.policies.open_robot(**params)

    async def act(self, observation: dict[str, Any], *, seed: int | None = None,
                  steps: int | None = None, session: Session | None = None
                  ) -> dict[str, Any]:
        """The action chunk for ``observation`` (see PolicyCalls.act)."""
        return await self.policies.act(observation, seed=seed, steps=steps, session=session)

    def health(self) -> dict[str, Any]:
        return self.orchestrator.health()

    def output_info(self, modality: str, pipeline: PipelineConfig | None = None) -> dict[str, Any]:
        """What the engine producing ``modality`` reported when it loaded (e.g. a TTS
        stage's voices and sample rate); {} while none of its replicas is live.
        ``pipeline``: one of this pipeline's views (its own final stages)."""
        pipeline = pipeline or self.pipeline
        info: dict[str, Any] = {}
        for stage in pipeline.outputs.get(modality, ()):
            info = self.stage_info(stage)
            if info:
                break
        if info and "voices" not in info:  # the voice is chosen by an upstream stage
            for stage in pipeline.route([modality]).stages:
                upstream = self.stage_info(stage)
                if upstream.get("voices") or upstream.get("voice_clone"):
                    voice = {k: upstream[k] for k in VOICE_KEYS if k in upstream}
                    info = {**info, **voice, "voice_stages": [stage]}
                    break
        return info

    def stage_info(self, stage: str) -> dict[str, Any]:
        """What a stage's engine reported when it loaded; {} while none is live."""
        for replica in self.orchestrator.engines.pools[stage].live():
            return dict(replica.info)
        return {}


class Omni:
    """Blocking wrapper for scripts: runs an AsyncOmni on a private event-loop thread."""

    def __init__(self, pipeline: PipelineConfig | str | os.PathLike, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="omni-loop")
        self._thread.start()
        self._omni = self._call(self._make(pipeline, kwargs))

    @staticmethod
    async def _make(pipeline: Any, kwargs: dict[str, Any]) -> AsyncOmni:
        return await AsyncOmni(pipeline, **kwargs).start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def generate(self, inputs: dict[str, Any], **kwargs: Any) -> list[OmniOutput]:
        """Run one request to completion and return all of its outputs."""
        async def collect() -> list[OmniOutput]:
            return [out async for out in self._omni.generate(inputs, **kwargs)]
        return self._call(collect())

    def stream(self, inputs: dict[str, Any], **kwargs: Any) -> Iterator[OmniOutput]:
        """Yield outputs as they arrive (blocking between them)."""
        agen = self._omni.generate(inputs, **kwargs)
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())

    def close(self) -> None:
        if self._loop.is_running():
            self._call(self._omni.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InputStream(Submitted):
    """A request admitted with more input to come (AsyncOmni.open_stream)."""

    closing_reason = "the input stream was closed"

    def feed(self, data: dict[str, Any], last: bool = False) -> None:
        self.omni.feed(self.request_id, data, last)


class OmniView:
    """A served id that runs a view of an AsyncOmni's pipeline (omni/config/views.py) on
    that AsyncOmni's engines: what the API layer uses of AsyncOmni, nothing started twice."""

    def __init__(self, parent: AsyncOmni, name: str) -> None:
        self.parent, self.view_name = parent, name
        self.pipeline = parent.pipeline.views[name]
        self.orchestrator = parent.orchestrator

    @property
    def name(self) -> str:
        return self.view_name

    async def start(self) -> OmniView:
        return self  # the parent's start() starts the engines

    async def close(self, drain_timeout_s: float | None = None) -> None:
        return None  # the parent's close() stops them

    def generate(self, inputs: dict[str, Any], **kwargs: Any) -> AsyncIterator[OmniOutput]:
        return self.parent.generate(inputs, view=self.view_name, **kwargs)

    def submit(self, inputs: dict[str, Any], **kwargs: Any) -> Submitted:
        return self.parent.submit(inputs, view=self.view_name, **kwargs)

    def output_info(self, modality: str) -> dict[str, Any]:
        return self.parent.output_info(modality, self.pipeline)

    def stage_info(self, stage: str) -> dict[str, Any]:
        return self.parent.stage_info(stage)

    def health(self) -> dict[str, Any]:
        return self.parent.health()

    async def abort(self, request_id: str) -> bool:
        return self.parent.orchestrator.abort(request_id)

    def feed(self, request_id: str, data: dict[str, Any], last: bool = False) -> None:
        self.parent.feed(request_id, data, last)

    def open_stream(self, inputs: dict[str, Any], **kwargs: Any) -> InputStream:
        return self.parent.open_stream(inputs, view=self.view_name, **kwargs)

    # sessions are the parent's (one manager per set of engines); turns run on the view
    @property
    def sessions(self) -> PipelineSessions:
        return self.parent.sessions

    def open_session(self, kind: str = "conversation",
                     params: dict[str, Any] | None = None) -> Session:
        return self.parent.open_session(kind, params)

    def append(self, session_id: str, item: dict[str, Any], fence: Fence | None = None) -> None:
        self.parent.append(session_id, item, fence)

    def signal(self, session_id: str, kind: str, fence: Fence | None = None) -> Fence:
        return self.parent.signal(session_id, kind, fence)

    def close_session(self, session_id: str, reason: str = "closed by the client") -> bool:
        return self.parent.close_session(session_id, reason)

    def respond(self, session_id: str, **kwargs: Any) -> AsyncIterator[OmniOutput]:
        return self.parent.respond(session_id, view=self.view_name, **kwargs)
