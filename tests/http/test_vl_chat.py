"""Image chat on Qwen2.5-VL and Qwen3-VL directories (tiny random release-layout
checkpoints, served through the preset their config.json picks) with the unmodified
openai SDK: ``image_url`` parts as data: URLs answer with what transformers' ``generate``
answers for the same image; bad image parts are 400s naming the part."""

from __future__ import annotations

import asyncio
import base64

import openai
import pytest
from httputil import Server, ServerSettings, run
from test_omni_chat import huge_png_header
from unit.vl_reference import GREEDY, QUESTION, png, reference

from omni.fixtures.tiny_models import ensure_tiny_model

MODELS = ("qwen2_5_vl", "qwen3_vl")
SEEDED = {"max_tokens": GREEDY["max_tokens"], "temperature": 0,
          "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    dirs = {name: ensure_tiny_model(name, tmp_path_factory.getbasetemp() / "models")
            for name in MODELS}
    srv = Server(dirs, ServerSettings(drain_timeout_s=2.0)).start()
    yield srv, dirs
    srv.stop()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def ask(url: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": QUESTION}]}]


@pytest.mark.parametrize("name", MODELS)
def test_image_chat_answers_as_transformers_generate(served, name):
    from transformers import AutoTokenizer

    server, dirs = served
    images = [png(64, 48, 1), png(64, 48, 3)]

    async def body():
        async with server.client(timeout=60) as client:
            return await asyncio.gather(*(client.chat.completions.create(
                model=name, messages=ask(data_url(image)), **SEEDED) for image in images))

    answers = run(body())
    texts = [a.choices[0].message.content for a in answers]
    assert texts[0] != texts[1] and len(set(texts[0])) > 4  # varies with the image
    tok = AutoTokenizer.from_pretrained(dirs[name])
    for image, text in zip(images, texts, strict=True):
        want = tok.decode(reference(str(dirs[name]), [image], GREEDY["max_tokens"]),
                          skip_special_tokens=True)
        assert text == want


def test_bad_image_parts_are_400s(served):
    server, _ = served
    cases = ((data_url(b"AAAA"), "not an image this server can read"),
             ("file:///etc/passwd", "file URLs are refused"),
             (huge_png_header(), "10000x10000"))

    async def body():
        async with server.client(timeout=30) as client:
            for url, needle in cases:
                with pytest.raises(openai.BadRequestError) as info:
                    await client.chat.completions.create(model="qwen2_5_vl",
                                                         messages=ask(url), **SEEDED)
                assert needle in info.value.message, info.value.message
                assert info.value.body["param"] == "messages[0].content[0]"
            video = {"type": "video_url", "video_url": {"url": data_url(png(8, 8, 1))}}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model="qwen3_vl", messages=[
                    {"role": "user", "content": [video]}], **SEEDED)
            assert "does not take 'video_url'" in info.value.message, info.value.message
    run(body())
