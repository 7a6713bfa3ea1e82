"""Cosmos 3's policy mode behind the same OpenPI WebSocket as π0 (a second policy
family, no front-end or engine change): metadata first, then (chunk_size, width)
actions; two policies served side by side are each reachable at /openpi/{model}."""

from __future__ import annotations

import textwrap

import aiohttp
import numpy as np
import pytest
from httputil import run

from omni.api.openpi import codec
from omni.fixtures.tiny_models import ensure_tiny_model


@pytest.fixture(scope="module")
def server(start_server, tmp_path_factory):
    models = tmp_path_factory.getbasetemp() / "models"
    cosmos, pi0 = ensure_tiny_model("cosmos3", models), ensure_tiny_model("pi0", models)
    return start_server({
        "cosmos": textwrap.dedent(f"""\
            name: cosmos
            default_modalities: [actions]
            stages:
              - {{name: policy, engine: policy, model: cosmos3_policy, model_dir: {cosmos},
                  final_output: actions, options: {{domain: droid_lerobot, steps: 3}}}}
            """),
        "pi0": textwrap.dedent(f"""\
            name: pi0
            default_modalities: [actions]
            stages:
              - {{name: policy, engine: policy, model: pi0, model_dir: {pi0},
                  final_output: actions}}
            """)})


def test_cosmos3_policy_over_openpi(server):
    async def body():
        async with server.session() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect("/")  # two policies: the path must name one
            assert info.value.status == 400
            ws = await http.ws_connect("/openpi/cosmos", max_msg_size=0)
            meta = codec.unpackb((await ws.receive(timeout=30)).data)
            assert meta["policy"] == "cosmos3" and meta["action_dim"] == 10
            image = np.random.RandomState(0).randint(0, 255, (64, 64, 3), dtype=np.uint8)
            await ws.send_bytes(codec.packb({"observation/image": image, "prompt": "wipe",
                                             "seed": 3}))
            reply = codec.unpackb((await ws.receive(timeout=60)).data)
            assert reply["actions"].shape == (4, 10) and reply["seed"] == 3
            await ws.close()
            ws = await http.ws_connect("/openpi/pi0", max_msg_size=0)
            assert codec.unpackb((await ws.receive(timeout=30)).data)["policy"] == "pi0"
            await ws.close()
    run(body())
