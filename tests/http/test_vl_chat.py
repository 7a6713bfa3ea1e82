"""Image chat on Qwen2.5-VL and Qwen3-VL directories (tiny random release-layout
checkpoints, served through the preset their config.json picks) with the unmodified
openai SDK: ``image_url`` and ``video_url`` parts as data: URLs answer with what
transformers' ``generate`` answers for the same image / video; bad image and video parts
are 400s naming the part."""

from __future__ import annotations

import asyncio
import base64

import openai
import pytest
from httputil import Server, ServerSettings, run
from test_omni_chat import huge_png_header
from test_realtime import until
from unit.vl_reference import GREEDY, QUESTION, mp4, png, reference, video_reference

from omni.fixtures.tiny_models import ensure_tiny_model
from omni.media.fetch import FetchPolicy

MODELS = ("qwen2_5_vl", "qwen3_vl")
MAX_MEDIA_BYTES = 1 << 20  # a small fetch limit, to see an oversized video refused
SEEDED = {"max_tokens": GREEDY["max_tokens"], "temperature": 0,
          "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    dirs = {name: ensure_tiny_model(name, tmp_path_factory.getbasetemp() / "models")
            for name in MODELS}
    srv = Server(dirs, ServerSettings(drain_timeout_s=2.0,
                                      media_fetch=FetchPolicy(max_bytes=MAX_MEDIA_BYTES))).start()
    yield srv, dirs
    srv.stop()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode()


def ask(url: str, kind: str = "image") -> list[dict]:
    """A question about one image (or video: kind "video") part."""
    part = f"{kind}_url"
    return [{"role": "user", "content": [{"type": part, part: {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


def answers_equal_generate(served, name: str, media: list[bytes], kind: str, mime: str,
                           reference_tokens) -> None:
    """Two media parts asked about concurrently: the answers vary with the media and equal
    transformers' generate (``reference_tokens(model_dir, media, max_tokens)``)."""
    from transformers import AutoTokenizer

    server, dirs = served

    async def body():
        async with server.client(timeout=60) as client:
            return await asyncio.gather(*(client.chat.completions.create(
                model=name, messages=ask(data_url(item, mime), kind), **SEEDED)
                for item in media))

    texts = [a.choices[0].message.content for a in run(body())]
    assert texts[0] != texts[1] and len(set(texts[0])) > 4  # varies with the media
    tok = AutoTokenizer.from_pretrained(dirs[name])
    for item, text in zip(media, texts, strict=True):
        want = tok.decode(reference_tokens(str(dirs[name]), item, GREEDY["max_tokens"]),
                          skip_special_tokens=True)
        assert text == want


@pytest.mark.parametrize("name", MODELS)
def test_image_chat_answers_as_transformers_generate(served, name):
    answers_equal_generate(served, name, [png(64, 48, 1), png(64, 48, 3)], "image",
                           "image/png", lambda d, image, n: reference(d, [image], n))


def test_bad_image_parts_are_400s(served):
    server, _ = served
    truncated = png(64, 48, 1)[:4000]  # its header passes the API's check: the engine refuses it
    cases = ((data_url(b"AAAA"), "not an image this server can read"),
             ("file:///etc/passwd", "file URLs are refused"),
             (huge_png_header(), "10000x10000"),
             (data_url(truncated), "messages[0].content[0]: not an image this server can read"))

    async def body():
        async with server.client(timeout=30) as client:
            for url, needle in cases:
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(model="qwen2_5_vl",
                                                         messages=ask(url), **SEEDED)
                assert needle in info.value.message, info.value.message
                assert info.value.body["param"] == "messages[0].content[0]"
            audio = {"type": "audio_url", "audio_url": {"url": data_url(b"RIFF", "audio/wav")}}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="qwen3_vl", messages=[
                    {"role": "user", "content": [audio]}], **SEEDED)
            assert "does not take audio input" in info.value.message, info.value.message
            # the Responses API names the engine's refusal as the input item
            with pytest.raises(openai.BadRequestError) as info:
                await client.responses.create(model="qwen3_vl", max_output_tokens=4, input=[
                    {"role": "user", "content": [
                        {"type": "input_text", "text": QUESTION},
                        {"type": "input_image", "image_url": data_url(truncated)}]}])
            assert "input[0].content[1]: not an image this server can read" \
                in info.value.message, info.value.message
            assert info.value.body["param"] == "input[0].content[1]"
    run(body())


@pytest.mark.parametrize("stream", [True, False])
def test_image_chat_is_submitted_before_the_loop_moves_on(served, monkeypatch, stream):
    """A chat whose image was read and checked reaches the orchestrator in that same step
    of its handler, before the event loop runs anything queued meanwhile (other requests'
    body reads and base64 decodes). Submitted from a task of its own, as the handler once
    did, a burst of 8 reached the engine as 1 and, ~20 ms later, 7: two encoder batches."""
    from omni.api import chat

    server, _ = served
    orchestrator = server.models["qwen3_vl"].omni.orchestrator
    order: list[str] = []
    prepare, submit = chat.prepare_media, orchestrator.submit

    async def prepared(*args, **kwargs):
        extra = await prepare(*args, **kwargs)
        asyncio.get_running_loop().call_soon(order.append, "loop")  # what waits meanwhile
        return extra

    def submitted(*args, **kwargs):
        order.append("submit")
        return submit(*args, **kwargs)

    monkeypatch.setattr(chat, "prepare_media", prepared)
    monkeypatch.setattr(orchestrator, "submit", submitted)

    async def body():
        async with server.client(timeout=60) as client:
            answer = await client.chat.completions.create(
                model="qwen3_vl", messages=ask(data_url(png(64, 48, 1))), stream=stream,
                max_tokens=2)
            if stream:
                return [chunk async for chunk in answer]
            return answer

    assert run(body())
    assert order == ["submit", "loop"]


@pytest.mark.parametrize("name", MODELS)
def test_video_chat_answers_as_transformers_generate(served, name):
    answers_equal_generate(served, name, [mp4(1), mp4(2)], "video", "video/mp4",
                           video_reference)


def test_bad_video_parts_are_400s(served, monkeypatch):
    from omni.media.video import encode_mp4

    server, _ = served
    # the server runs in this process: mp4(1) lasts 2 s, over this limit
    monkeypatch.setattr("omni.api.chat_media.MAX_VIDEO_SECONDS", 1.0)
    junk = b"\0" * (MAX_MEDIA_BYTES + 1)
    cases = ((data_url(b"AAAA", "video/mp4"), "not a video this server can read"),
             (data_url(png(32, 32, 1), "video/mp4"), "not a video this server can read"),
             (data_url(junk, "video/mp4"), f"larger than {MAX_MEDIA_BYTES} bytes"),
             (data_url(mp4(1), "video/mp4"), "at most 1 s are accepted"))
    one_frame = encode_mp4(black_frames(1), 10)

    async def body():
        async with server.client(timeout=30) as client:
            for url, needle in cases:
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(model="qwen3_vl",
                                                         messages=ask(url, "video"), **SEEDED)
                assert needle in info.value.message, info.value.message
                assert info.value.body["param"] == "messages[0].content[0]"
            # readable, but fewer frames than a temporal patch: the model refuses it
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(
                    model="qwen2_5_vl", messages=ask(data_url(one_frame, "video/mp4"), "video"),
                    **SEEDED)
            assert "messages[0].content[0]: the video has 1 frame(s); at least 2 are needed" \
                in info.value.message, info.value.message
            assert info.value.code == "invalid_input"
            assert info.value.body["param"] == "messages[0].content[0]"  # as the API's checks
    run(body())


def black_frames(frames: int):
    import numpy as np

    return np.zeros((frames, 48, 64, 3), dtype=np.uint8)


def image_item(url: str) -> dict:
    return {"type": "message", "role": "user", "content": [
        {"type": "input_image", "image_url": url}, {"type": "input_text", "text": QUESTION}]}


async def realtime_answer(client, name: str, image: bytes) -> str:
    """A fresh session's greedy text answer to one image and the question."""
    async with client.realtime.connect(model=name) as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                           "temperature": 0, "max_output_tokens": 8})
        assert (await conn.recv()).type == "session.updated"
        await conn.conversation.item.create(item=image_item(data_url(image)))
        await conn.response.create()
        events = await until(conn, "response.done")
        added = next(e for e in events if e.type == "conversation.item.added")
        assert added.item.content[0].type == "input_image"
        done = events[-1].response
        assert done.status == "completed", done
        return done.output[0].content[0].text


@pytest.mark.parametrize("name", MODELS)
def test_realtime_image_answers_as_chat_completions(served, name):
    server, _ = served
    images = [png(64, 48, 1), png(64, 48, 3)]

    async def body():
        async with server.client(timeout=60) as client:
            spoken = [await realtime_answer(client, name, image) for image in images]
            chat = await asyncio.gather(*(client.chat.completions.create(
                model=name, messages=ask(data_url(image)), max_tokens=8, temperature=0)
                for image in images))
            return spoken, [c.choices[0].message.content for c in chat]

    spoken, chat = run(body())
    assert spoken[0] != spoken[1] and len(set(spoken[0])) > 4  # varies with the image
    assert spoken == chat


def test_realtime_bad_images_are_error_events(served, monkeypatch):
    server, _ = served
    small = png(8, 8, 1)
    # the server runs in this process: a conversation may hold one such image, not two
    monkeypatch.setattr("omni.api.realtime.item_events.MAX_IMAGE_BYTES", len(small) + 1)
    cases = ((data_url(b"AAAA"), "not an image this server can read"),
             ("file:///etc/passwd", "file URLs are refused"),
             (huge_png_header(), "10000x10000"))

    async def body():
        async with server.client(timeout=30) as client:
            async with client.realtime.connect(model="qwen2_5_vl") as conn:
                assert (await conn.recv()).type == "session.created"
                for url, needle in cases:
                    await conn.conversation.item.create(item=image_item(url))
                    error = (await conn.recv()).error
                    assert needle in error.message, error.message
                    assert (error.param, error.code) == ("item.content[0]", "invalid_image")
                bad_role = {**image_item(data_url(small)), "role": "assistant"}
                await conn.conversation.item.create(item=bad_role)
                assert "belong to user messages" in (await conn.recv()).error.message
                await conn.conversation.item.create(item=image_item(data_url(small)))
                assert (await conn.recv()).type == "conversation.item.added"  # still open
                assert (await conn.recv()).type == "conversation.item.done"
                await conn.conversation.item.create(item=image_item(data_url(small)))
                error = (await conn.recv()).error
                assert "delete some items" in error.message, error.message
    run(body())
