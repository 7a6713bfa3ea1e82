"""/openapi.json is a valid OpenAPI 3.1 document of every route, and schemathesis, fuzzing
every operation in it, finds no server error: each answer is documented, each error an
OpenAI error object, and the server is healthy afterwards.

The fuzzed server serves echo pipelines (text, and audio out for the speech route), so
text requests run end to end; routes of modalities no served model has answer their
documented 404, which is what they do on such a server.
"""

from __future__ import annotations

import json
import urllib.request
from collections import Counter
from typing import Any

import pytest
import schemathesis
from httputil import assert_error_object, one_stage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from omni.api.openapi import ROUTES, openapi_path

SERVED = {"echo": "echo", "speech": one_stage("speech", final="audio")}
EXAMPLES_PER_OPERATION = 25


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, json.loads(response.read())


@pytest.fixture(scope="module")
def server(start_server):
    return start_server(SERVED)


@pytest.fixture(scope="module")
def document(server):
    status, body = _get_json(f"{server.url}/openapi.json")
    assert status == 200
    return body


@pytest.fixture(scope="module")
def api_schema(document):
    """The served document, with 'model' narrowed to the served ids: a random string
    would only ever reach the 404 of an unknown model."""
    fuzzed = json.loads(json.dumps(document))
    for schema in fuzzed["components"]["schemas"].values():
        model = schema.get("properties", {}).get("model")
        if model is not None:
            model["enum"] = sorted(SERVED)
    return schemathesis.openapi.from_dict(fuzzed)


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
    cases = st.one_of([operation.as_strategy(generation_mode=mode) for mode in MODES])

    @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck), database=None)
    @given(case=cases)
    def fuzz(case: Any) -> None:
        response = case.call(base_url=server.url, timeout=20)
        statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    statuses: Counter[int] = Counter()
    fuzz()
    print(method, path, dict(statuses))


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
