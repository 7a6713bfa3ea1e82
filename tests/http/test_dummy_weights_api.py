"""`python -m omni.server --model DIR --load-format dummy` through the unmodified openai SDK:
a tiny FLUX.2 directory with every weight file deleted is served by its built-in preset
(picked from model_index.json) with random weights, as the flag configures it, and answers
/v1/images/generations with a PNG of the requested size; its card on /v1/models says the
weights are random. Without the flag the same directory could not load (the stripped
copy has no weights: tests/unit/test_dummy_weights.py). The same for a text model's
directory (an ar stage, tests/unit/test_dummy_weights_ar.py) on /v1/chat/completions."""

from __future__ import annotations

import base64
import io
import shutil

import pytest
import torch
from httputil import Server, ServerSettings, run
from PIL import Image

from omni.api.state import ServedModel
from omni.fixtures.tiny_models import ensure_tiny_model
from omni.server import parse_args, served_models

torch.set_num_threads(1)
NAME = "flux2-shapes"
TEXT = "qwen3-shapes"


class FlagServer(Server):
    """The models exactly as omni.server builds them from its command line."""

    def __init__(self, argv: list[str]) -> None:
        super().__init__({}, ServerSettings(drain_timeout_s=2.0))
        self.argv = argv

    def served(self) -> list[ServedModel]:
        return served_models(parse_args(self.argv), self.metrics)


def _stripped(tmp_path_factory, family: str):
    release = ensure_tiny_model(family, tmp_path_factory.getbasetemp() / "models")
    stripped = tmp_path_factory.mktemp("dummy") / family
    shutil.copytree(release, stripped)
    for weights in stripped.rglob("*.safetensors*"):
        weights.unlink()
    return stripped


def _serve(tmp_path_factory, family: str, name: str):
    srv = FlagServer(["--model", str(_stripped(tmp_path_factory, family)),
                      "--served-model-name", name, "--load-format", "dummy"]).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(tmp_path_factory, "flux2", NAME)


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    yield from _serve(tmp_path_factory, "qwen3", TEXT)


def test_random_weights_answer_with_an_image_of_the_requested_size(server):
    async def body():
        async with server.client() as client:
            result = await client.images.generate(
                model=NAME, prompt="a red fox", size="64x32",
                extra_body={"seed": 3, "num_inference_steps": 2})
            card = (await client.models.retrieve(NAME)).model_dump()
        return result, card
    result, card = run(body())
    assert len(result.data) == 1 and result.size == "64x32"
    image = Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json)))
    assert image.format == "PNG" and image.size == (64, 32)
    assert card["stages"]["diffusion"]["load_format"] == "dummy"


def test_a_text_model_with_random_weights_answers_a_chat(text_server):
    async def body():
        async with text_server.client() as client:
            reply = await client.chat.completions.create(
                model=TEXT, messages=[{"role": "user", "content": "Say hello."}],
                max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
            card = (await client.models.retrieve(TEXT)).model_dump()
        return reply, card
    reply, card = run(body())
    assert reply.usage.completion_tokens == 6
    assert [s.get("load_format") for s in card["stages"].values()] == ["dummy"]
