"""`placement:` and `cluster:` in a pipeline file, and where each stage's payloads go."""

from __future__ import annotations

import pytest

from omni.config.pipeline import ConfigError, parse_pipeline
from omni.config.placement import ClusterSettings, Placement
from omni.engines.proc.spec import payload_options, stage_spec
from omni.wire.curve import CurveKeys


def chain(b_placement=None, cluster=None, connector="auto"):
    b = {"name": "b", "engine": "echo"}
    if b_placement is not None:
        b["placement"] = b_placement
    data = {"name": "p", "stages": [{"name": "a", "engine": "echo"}, b,
                                    {"name": "c", "engine": "echo", "final_output": "text"}],
            "edges": [{"from": "a", "to": "b", "connector": connector},
                      {"from": "b", "to": "c", "connector": connector}]}
    if cluster is not None:
        data["cluster"] = cluster
    return parse_pipeline(data)


def test_placements_parse():
    assert chain().stage("b").placement == Placement() and not chain().remote
    assert chain().cluster is None
    ray = chain("ray")
    assert ray.stage("b").placement.remote and ray.remote
    assert ray.cluster == ClusterSettings()  # defaults when a stage runs on Ray
    full = chain({"kind": "ray", "cpus": 2, "gpus": 0.5, "node_ip": "10.0.0.2",
                  "resources": {"host_b": 0.01}})
    placement = full.stage("b").placement
    assert (placement.cpus, placement.gpus, placement.node_ip) == (2.0, 0.5, "10.0.0.2")
    assert dict(placement.resources) == {"host_b": 0.01}


@pytest.mark.parametrize(("placement", "message"), [
    ("cloud", "expected local, ray"),
    ({"kind": "cloud"}, "unknown placement"),
    ({"kind": "ray", "cpus": -1}, "expected a number >= 0"),
    ({"kind": "ray", "node_ip": "host-b"}, "expected an IP address"),
    ({"kind": "ray", "gpu": 1}, "gpu"),
    ({"kind": "local", "cpus": 1}, "resources are for placement kind ray"),
])
def test_bad_placements_are_refused(placement, message):
    with pytest.raises(ConfigError, match=message):
        chain(placement)


def test_ray_placement_and_external_launch_conflict():
    with pytest.raises(ConfigError, match="Ray starts this stage's replicas"):
        parse_pipeline({"name": "p", "stages": [
            {"name": "s", "engine": "echo", "final_output": "text", "launch": "external",
             "placement": "ray"}]})


def test_cluster_settings():
    cluster = chain("ray", {"ray_address": "10.0.0.1:6379", "host": "10.0.0.1",
                            "control_port": 5600, "encrypt_payloads": False}).cluster
    assert cluster == ClusterSettings("10.0.0.1:6379", "10.0.0.1", 5600, False)
    for bad, message in (({"control_port": 70000}, "is not a port"),
                         ({"host": "example.org"}, "expected an IP address"),
                         ({"encrypt_payloads": "no"}, "encrypt_payloads"),
                         ({"ray_adress": "auto"}, "ray_adress")):
        with pytest.raises(ConfigError, match=message):
            chain("ray", bad)


def test_payloads_that_cross_hosts_take_a_remote_backend():
    local = chain()
    assert all("remote" not in payload_options(local, s) for s in "abc")
    ray = chain("ray")
    keys = CurveKeys.generate().to_dict()
    a, b, c = (payload_options(ray, s, keys, "10.0.0.1") for s in "abc")
    assert a["remote"] == b["remote"] == "auto"  # a feeds another host, b runs on one
    assert a["host"] == "10.0.0.1" and a["curve"] == keys
    assert "remote" not in c  # c runs here and feeds only the front end, here too
    named = chain("ray", connector="mooncake")
    assert payload_options(named, "a")["remote"] == "mooncake"
    assert payload_options(chain(connector="zmq"), "a")["remote"] == "zmq"  # named: always


def test_control_keys_only_for_the_remote_stage_and_payload_keys_only_when_encrypted():
    ray = chain("ray")
    keys = CurveKeys.generate().to_dict()

    def spec(stage, encrypt=True):
        return stage_spec(ray, stage, 0, control_address="ipc:///x", arena_name="x",
                          curve=keys, data_host="10.0.0.1", encrypt_payloads=encrypt)
    assert spec("b").curve == keys and spec("a").curve is None
    assert spec("a").payload_options["curve"] == keys
    assert "curve" not in spec("a", encrypt=False).payload_options


def test_ray_is_not_imported_without_remote_stages():
    """Local pipelines keep working exactly as before: nothing imports Ray for them, from
    importing the server to starting the pipeline's engines and serving a request."""
    import subprocess
    import sys

    code = ("import asyncio, sys\n"
            "import omni.server\n"
            "from omni.config.presets import load_pipeline\n"
            "from omni.runtime.async_omni import AsyncOmni\n"
            "async def main():\n"
            "    async with AsyncOmni(load_pipeline('echo')) as omni:\n"
            "        outputs = [o async for o in omni.generate({'prompt': 'hi'})]\n"
            "        assert outputs and outputs[-1].finished, outputs\n"
            "        assert 'ray' not in sys.modules, 'ray was imported'\n"
            "    assert 'ray' not in sys.modules, 'ray was imported'\n"
            "    print('served without ray')\n"
            "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "served without ray" in done.stdout, (done.stdout, done.stderr[-2000:])


def test_an_engine_device_names_the_gpu_its_payloads_land_on():
    from omni.wire.payloads import PayloadPlane

    assert PayloadPlane("x", {"device": "cuda:1"}).device == 1
    assert PayloadPlane("x", {"device": "cpu"}).device is None
    assert PayloadPlane("x").device is None
    assert "device" not in PayloadPlane("x", {"device": "cuda:0"}).options  # not a connector kwarg
