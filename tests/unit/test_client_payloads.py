"""The front side of the data plane: outputs of a replica on another host are fetched off
the event loop (a 64 MiB fetch would stall every other stream), local ones on it; both give
the producer's blocks back."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from omni.connector import ConnectorError, make_connector
from omni.connector.zmq_data import ZmqConnector
from omni.runtime.client_payloads import ClientPayloads

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024


@pytest.fixture
def remote_producer():
    producer = ZmqConnector("test-remote-producer", capacity_bytes=64 * MiB)
    yield producer
    producer.close()


@pytest.fixture
def front():
    payloads = ClientPayloads("test-front")
    yield payloads
    payloads.close()


def record_take_threads(monkeypatch) -> list[str]:
    """Which thread each output was taken on (a spy around the real take)."""
    from omni.runtime import client_payloads as payloads

    threads: list[str] = []
    real_take = payloads._take

    def take(plane, data):
        threads.append(threading.current_thread().name)
        return real_take(plane, data)

    monkeypatch.setattr(payloads, "_take", take)
    return threads


def test_a_remote_output_is_fetched_off_the_loop_and_released(remote_producer, front,
                                                              monkeypatch):
    tensor = torch.randn(1024, 1024)  # 4 MiB: a zmq ref, not inline
    assert tensor.std() > 0.5  # the comparison below compares real data
    data = {"audio": remote_producer.put(tensor, owner="r1").to_wire(), "text": "hi"}
    threads = record_take_threads(monkeypatch)

    async def main():
        loop_thread = threading.current_thread().name
        taken = await front.take_async(data)
        return loop_thread, taken

    loop_thread, taken = asyncio.run(main())
    assert taken["text"] == "hi" and torch.equal(taken["audio"], tensor)
    assert threads and all(name.startswith("omni-fetch") for name in threads)
    assert loop_thread not in threads
    front.close()  # its releases have gone out
    assert asyncio.run(_wait_released(remote_producer)), remote_producer.health()


def test_a_discarded_remote_output_goes_back_to_its_producer(remote_producer, front):
    data = {"audio": remote_producer.put(torch.ones(1 * MiB), owner="r2").to_wire()}
    front.discard(data)
    front.close()
    assert asyncio.run(_wait_released(remote_producer)), remote_producer.health()


def test_a_local_output_is_taken_on_the_loop(front, monkeypatch):
    shm = make_connector("shm", name="test-front-local")
    try:
        tensor = torch.arange(1 * MiB, dtype=torch.float32)
        data = {"image": shm.put(tensor, owner="r3").to_wire()}
        threads = record_take_threads(monkeypatch)

        async def main():
            return threading.current_thread().name, await front.take_async(data)

        loop_thread, taken = asyncio.run(main())
        assert torch.equal(taken["image"], tensor) and threads == [loop_thread]
        assert shm.health()["payloads_in_use"] == 0  # given back at once
    finally:
        shm.close()


def test_a_dead_producer_does_not_hold_up_another_hosts_outputs(remote_producer, front):
    dead = ZmqConnector("test-dead-producer", capacity_bytes=8 * MiB)
    doomed = {"audio": dead.put(torch.ones(1 * MiB), owner="r4").to_wire()}
    dead.close()  # its host is gone: the fetch waits for the connector's timeout
    tensor = torch.randn(1 * MiB)
    alive = {"audio": remote_producer.put(tensor, owner="r5").to_wire()}

    async def main():
        waiting = asyncio.ensure_future(front.take_async(doomed))
        await asyncio.sleep(0.2)  # its fetch has started
        served = asyncio.ensure_future(front.take_async(alive))
        done, _ = await asyncio.wait({waiting, served}, return_when=asyncio.FIRST_COMPLETED)
        assert done == {served} and torch.equal(served.result()["audio"], tensor)
        with pytest.raises(ConnectorError, match="no answer from zmq producer"):
            await waiting

    asyncio.run(main())


async def _wait_released(producer: ZmqConnector, timeout_s: float = 10.0) -> bool:
    """Releases are fire-and-forget: poll the producer until it holds nothing."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if producer.health()["payloads_in_use"] == 0:
            return True
        await asyncio.sleep(0.02)
    return False
