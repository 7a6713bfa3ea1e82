"""pipecat (1.14.0) ``OpenAILLMService`` on omni's chat completions, driven the way a
voice bot drives it, through a pipeline: the service streams every answer
(``stream: true``); text comes out as ``LLMTextFrame``s, a tool call is assembled from
the streamed ``delta.tool_calls``, its registered handler runs, and the context
aggregators put the call and its result in the context and ask again. Also its
out-of-pipeline ``run_inference`` with a ``response_schema`` (json_schema, strict).

The tool goes in as ``custom_tools`` (an OpenAI tool dict) rather than a
``FunctionSchema``: a ``FunctionSchema`` sends its parameters without
``additionalProperties: false`` and has no way to add it, and omni constrains a call to
the schema as sent, which then allows extra keys of any length; random weights write
such keys about half the time, and the call runs past ``max_tokens``. The streaming,
the handler and the history are the same either way."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
from clientutil import MODEL, QUESTION, WEATHER_SCHEMA
from pipecat.adapters.llm.schemas.tools_schema import AdapterType, ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    LLMTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.workers.runner import WorkerRunner

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather forecast for a city.",
    "parameters": WEATHER_SCHEMA, "strict": True}}


class Collector(FrameProcessor):
    """Keeps every frame going downstream; ``done`` is set after ``answers`` complete
    answers (``LLMFullResponseEndFrame``s) or the first error."""

    def __init__(self, answers: int) -> None:
        super().__init__()
        self.frames: list[Frame] = []
        self.answers = answers
        self.done = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        ends = sum(isinstance(f, LLMFullResponseEndFrame) for f in self.frames)
        if ends >= self.answers or isinstance(frame, ErrorFrame):
            self.done.set()
        await self.push_frame(frame, direction)


def service(server, **settings: Any) -> OpenAILLMService:
    return OpenAILLMService(base_url=server.base_url, api_key="x",
                            settings=OpenAILLMService.Settings(model=MODEL, **settings))


async def run_pipeline(processors: list[FrameProcessor], first: Frame,
                       collector: Collector) -> None:
    worker = PipelineWorker(Pipeline(processors), cancel_on_idle_timeout=False,
                            enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)

    async def drive() -> None:
        try:
            await worker.queue_frame(first)
            await asyncio.wait_for(collector.done.wait(), 60)
        finally:
            await worker.queue_frame(EndFrame())

    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())


def test_an_answer_streams_as_text_frames(omni_server):
    llm = service(omni_server, max_tokens=16, seed=1)
    context = LLMContext(messages=[{"role": "user", "content": QUESTION}])
    collector = Collector(answers=1)
    asyncio.run(run_pipeline([llm, collector], LLMContextFrame(context), collector))
    assert not [f for f in collector.frames if isinstance(f, ErrorFrame)]
    texts = [f.text for f in collector.frames if isinstance(f, LLMTextFrame)]
    assert len(texts) > 3 and "".join(texts).strip()  # streamed, piece by piece


def test_a_forced_tool_call_runs_its_handler_and_the_answer_follows(omni_server):
    llm = service(omni_server, max_tokens=200, temperature=1.0, seed=3)
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        params.context.set_tool_choice("none")  # the next answer is text
        await params.result_callback({"forecast": f"sunny in {params.arguments['city']}"})

    llm.register_function("get_weather", get_weather)
    context = LLMContext(
        messages=[{"role": "user", "content": QUESTION}],
        tools=ToolsSchema(standard_tools=[], custom_tools={AdapterType.OPENAI: [WEATHER_TOOL]}),
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    pair = LLMContextAggregatorPair(context)
    collector = Collector(answers=2)  # the call, then the answer after its result
    asyncio.run(run_pipeline([pair.user(), llm, collector, pair.assistant()], LLMRunFrame(),
                             collector))

    assert not [f for f in collector.frames if isinstance(f, ErrorFrame)]
    assert calls
    for arguments in calls:
        jsonschema.validate(arguments, WEATHER_SCHEMA)
    user, assistant, *results, answer = context.get_messages()
    assert user == {"role": "user", "content": QUESTION}
    sent = assistant["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in sent] == calls
    assert [r["role"] for r in results] == ["tool"] * len(calls)
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in sent]
    assert [json.loads(r["content"]) for r in results] == [
        {"forecast": f"sunny in {c['city']}"} for c in calls]
    assert answer["role"] == "assistant" and answer["content"].strip()


def test_run_inference_with_a_response_schema(omni_server):
    llm = service(omni_server, temperature=1.0)
    context = LLMContext(messages=[{"role": "user", "content": QUESTION}])

    async def body() -> list[str | None]:
        return [await llm.run_inference(context, max_tokens=200,
                                        response_schema=WEATHER_SCHEMA) for _ in range(2)]

    texts = asyncio.run(body())
    answers = [json.loads(t) for t in texts if t]
    assert len(answers) == 2
    for answer in answers:
        jsonschema.validate(answer, WEATHER_SCHEMA)
    assert answers[0] != answers[1]  # sampled (no seed), not a stub
