"""Every failure is an OpenAI error object with the right status, type, param and code."""

from __future__ import annotations

import openai
import pytest
from httputil import MAIN_MAX_REQUEST_BYTES, assert_error_object, run

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hello"}]


async def _post(server, path, *, json=None, data=None, headers=None):
    async with server.session() as session:
        async with session.post(path, json=json, data=data, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.json(content_type=None)


def test_unknown_route_is_404_error_object(main_server):
    async def body():
        async with main_server.session() as session:
            for method, path in [("GET", "/v1/nope"), ("POST", "/v1/chat/complete"),
                                 ("GET", "/ui/nope.js")]:
                async with session.request(method, path) as resp:
                    assert resp.status == 404, path
                    assert resp.content_type == "application/json"
                    assert_error_object(await resp.json(), type_="invalid_request_error")
    run(body())


def test_wrong_method_is_405_error_object(main_server):
    async def body():
        async with main_server.session() as session:
            for method, path in [("GET", CHAT), ("PUT", "/v1/completions"),
                                 ("POST", "/v1/models"), ("POST", "/health")]:
                async with session.request(method, path) as resp:
                    assert resp.status == 405, (method, path)
                    assert resp.content_type == "application/json"
                    error = assert_error_object(await resp.json())
                    assert method in error["message"]
    run(body())


def test_wrong_method_keeps_allow_header(main_server):
    async def body():
        async with main_server.session() as session:
            async with session.get(CHAT) as resp:
                assert resp.status == 405
                assert "POST" in resp.headers.get("Allow", "")
    run(body())


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b'{"model": "echo",'],
                         ids=["garbage", "empty", "not-utf8", "truncated"])
def test_malformed_json_is_400(main_server, raw):
    status, _, body = run(_post(main_server, CHAT, data=raw,
                                headers={"Content-Type": "application/json"}))
    assert status == 400
    assert_error_object(body, type_="invalid_request_error")


@pytest.mark.parametrize("payload", [b"[]", b'[{"model": "echo"}]', b'"text"', b"42",
                                     b"null"], ids=["empty-array", "array", "string",
                                                    "number", "null"])
def test_json_that_is_not_an_object_is_400(main_server, payload):
    for path in (CHAT, "/v1/completions"):
        status, _, body = run(_post(main_server, path, data=payload,
                                    headers={"Content-Type": "application/json"}))
        assert status == 400, path
        assert_error_object(body, type_="invalid_request_error")


def test_body_over_size_limit_is_413(main_server):
    big = "x" * (MAIN_MAX_REQUEST_BYTES * 4)
    status, _, body = run(_post(main_server, CHAT, json={"model": "echo", "messages": [
        {"role": "user", "content": big}]}))
    assert status == 413
    error = assert_error_object(body, code="request_too_large")
    assert str(MAIN_MAX_REQUEST_BYTES) in error["message"]
    # just under the limit still works
    small = "y" * (MAIN_MAX_REQUEST_BYTES - 200)
    status, _, body = run(_post(main_server, CHAT, json={"model": "echo", "messages": [
        {"role": "user", "content": small}]}))
    assert status == 200 and body["choices"][0]["message"]["content"] == small


def test_body_over_size_limit_via_sdk(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.APIStatusError) as info:
                await client.completions.create(model="echo",
                                                prompt="z" * (MAIN_MAX_REQUEST_BYTES * 2))
        assert info.value.status_code == 413
        assert info.value.code == "request_too_large"
    run(body())


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": -1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"extra_body": {"min_p": 1.5}}, "min_p"),
    ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
    ({"extra_body": {"min_tokens": 9, "max_tokens": 3}}, "min_tokens"),
    ({"extra_body": {"stop_token_ids": [-1]}}, "stop_token_ids"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["a"] * 17}, "stop"),
    ({"seed": -3}, "seed"),
    pytest.param({"max_completion_tokens": 0}, "max_completion_tokens"),
])
def test_bad_sampling_params_are_400_with_param(main_server, kwargs, param):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="echo", messages=HELLO, **kwargs)
        assert info.value.status_code == 400
        assert info.value.param == param
        assert info.value.type == "invalid_request_error"
    run(body())


def test_bad_params_on_completions_too(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.completions.create(model="echo", prompt="x", temperature=-1)
            assert info.value.param == "temperature"
            with pytest.raises(openai.BadRequestError) as info:
                await client.completions.create(model="echo", prompt=[{"bad": 1}])
            assert info.value.param == "prompt"
    run(body())


@pytest.mark.parametrize("payload", [{"messages": HELLO}, {"model": "", "messages": HELLO},
                                     {"model": 7, "messages": HELLO}],
                         ids=["absent", "empty", "not-a-string"])
def test_missing_model_is_400(main_server, payload):
    status, _, body = run(_post(main_server, CHAT, json=payload))
    assert status == 400
    error = assert_error_object(body, type_="invalid_request_error", param="model")
    assert "echo" in error["message"]  # tells the client what it can ask for


def test_missing_or_bad_messages_is_400(main_server):
    for messages, param in [(None, "messages"), ([], "messages"),
                            ([{"content": "no role"}], "messages[0].role")]:
        status, _, body = run(_post(main_server, CHAT, json={"model": "echo",
                                                             "messages": messages}))
        assert status == 400
        assert_error_object(body, param=param)


def test_unknown_fields_are_accepted(main_server):
    """extra_body keys arrive at the top level; the server must not reject them."""
    async def body():
        async with main_server.client() as client:
            chat = await client.chat.completions.create(
                model="echo", messages=HELLO,
                extra_body={"top_k": 5, "mm_processor_kwargs": {"fps": 2}, "whatever": True})
        assert chat.choices[0].message.content == "hello"
    run(body())


def test_explicit_null_n_means_default(main_server):
    status, _, body = run(_post(main_server, CHAT, json={"model": "echo", "messages": HELLO,
                                                         "n": None}))
    assert status == 200, body
    assert [c["index"] for c in body["choices"]] == [0]  # one choice, as with n omitted
    assert body["choices"][0]["message"]["content"]


def test_unserved_workload_endpoints_name_served_models(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.NotFoundError) as info:
                await client.images.generate(model="echo", prompt="a cat")
            assert "echo" in info.value.message and "streamy" in info.value.message
        status, _, err = await _post(main_server, "/v1/images/generations",
                                     json={"model": "echo"})
        assert status == 404
        error = assert_error_object(err, type_="invalid_request_error")
        assert "/v1/images/generations" in error["message"] and "echo" in error["message"]
    run(body())


def test_speech_from_a_model_without_audio_is_refused(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.audio.speech.create(model="echo", voice="alloy", input="hi")
            assert info.value.param == "model"
            assert "does not output audio" in info.value.message
            assert "speech" in info.value.message  # names the served models with audio
    run(body())


def test_model_without_text_output_refused_for_chat(main_server):
    async def body():
        async with main_server.client() as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="speech", messages=HELLO)
            assert info.value.param == "model"
            assert "audio" in info.value.message
            with pytest.raises(openai.BadRequestError):
                await client.completions.create(model="speech", prompt="x")
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="speech", messages=HELLO,
                                                     stream=True)
    run(body())
    assert main_server.in_flight("speech")["requests"] == []


def test_engine_failure_before_output_is_500_no_retry(main_server):
    """The stage fails at its first step, before any output: the status line can still
    carry it, so a stream request gets a 500 error object, not a 200 stream."""
    async def body():
        for stream in (False, True):
            status, headers, err = await _post(main_server, CHAT, json={
                "model": "fail", "messages": HELLO, "stream": stream})
            assert status == 500, stream
            assert headers["Content-Type"].startswith("application/json")
            assert headers.get("x-should-retry") == "false"
            error = assert_error_object(err, type_="server_error")
            assert "injected failure" in error["message"]
        def failed() -> float:
            return main_server.metrics.registry.get_sample_value(
                "omni_requests_total", {"pipeline": "fail", "outcome": "RequestFailedError"})
        before = failed()
        async with main_server.client(max_retries=2) as client:
            with pytest.raises(openai.InternalServerError) as info:
                await client.chat.completions.create(model="fail", messages=HELLO)
            assert info.value.type == "server_error"
        assert failed() == before + 1  # x-should-retry: false -> the SDK sent it once
    run(body())
    assert main_server.in_flight("fail")["requests"] == []


def test_failure_after_stream_started_is_sse_error_event(main_server):
    """t1's text streams out (HTTP 200), then t2 fails: the SDK must raise APIError
    part-way through the stream, after the text deltas."""
    async def body():
        async with main_server.client() as client:
            stream = await client.chat.completions.create(
                model="midfail", messages=[{"role": "user", "content": "abcdef"}], stream=True)
            received = []
            with pytest.raises(openai.APIError) as info:
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        received.append(chunk.choices[0].delta.content)
        assert "".join(received) == "abcdef"
        assert "injected failure" in info.value.message
        assert not isinstance(info.value, openai.APIStatusError)  # it came after the 200
    run(body())
    assert main_server.in_flight("midfail")["requests"] == []


def test_unencodable_input_is_rejected_without_leaking(main_server):
    messages = [{"role": "user", "content": "hi", "name": 2**70}]
    try:
        status, _, body = run(_post(main_server, CHAT, json={"model": "echo",
                                                             "messages": messages}))
        state = main_server.in_flight("echo")
        assert state["requests"] == [] and not any(state["outstanding"].values()), state
        assert status == 400, body
    finally:  # do not leave the leak behind for other tests
        orch = main_server.models["echo"].omni.orchestrator
        main_server.inspect(lambda: [orch.abort(r) for r in list(orch.requests)])
