"""`python -m omni.server --quantization fp8`: an AR model and a diffusion model served with
fp8 weights from the command line; each stage's card says so, and both answer."""

from __future__ import annotations

import base64
import io
import json
import urllib.request

import numpy as np
from PIL import Image
from test_server_e2e import Server, _post

from omni.fixtures.tiny_models import ensure_tiny_model


def test_the_flag_serves_ar_and_diffusion_stages_in_fp8(tmp_path_factory) -> None:
    cache = tmp_path_factory.getbasetemp() / "models"
    image_dir, llm_dir = ensure_tiny_model("qwen_image", cache), ensure_tiny_model("qwen3", cache)
    server = Server("--model", str(image_dir), "--model", str(llm_dir), "--quantization", "fp8",
                    "--no-ui")
    try:
        server.wait_listening(timeout=180)
        with urllib.request.urlopen(server.url("/v1/models"), timeout=10) as resp:
            cards = {m["id"]: m for m in json.loads(resp.read())["data"]}
        for model in ("qwen_image", "qwen3"):
            (stage,) = cards[model]["stages"].values()
            assert stage["quantization"] == "fp8" and stage["quantized_weights"] > 0, stage
        assert "fp8 weights: 28 linear layers" in server.log()  # the READY line says it too
        status, body = _post(server.url("/v1/images/generations"), {
            "model": "qwen_image", "prompt": "a red fox", "size": "32x32",
            "num_inference_steps": 3, "seed": 1})
        assert status == 200, body
        image = np.asarray(Image.open(io.BytesIO(base64.b64decode(body["data"][0]["b64_json"]))))
        assert image.shape == (32, 32, 3) and image.std() > 5  # not flat
        status, body = _post(server.url("/v1/chat/completions"), {
            "model": "qwen3", "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 6, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 6, body
    finally:
        server.stop()
    assert "stopped" in server.log()
