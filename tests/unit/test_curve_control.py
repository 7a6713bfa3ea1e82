"""The control plane to other hosts: a CURVE router admits only the launch's client key."""

from __future__ import annotations

import os
import stat
import time

import pytest
import zmq

from omni.engines.proc.channel import Channel
from omni.runtime.control import ControlRouter
from omni.wire.curve import CurveKeys
from omni.wire.protocol import Ready, Shutdown, check_address, decode, encode


def _pump(router: ControlRouter, received: list, seconds: float, want: int) -> None:
    """Drain the router (no event loop here) until ``want`` messages or ``seconds``."""
    deadline = time.monotonic() + seconds
    while len(received) < want and time.monotonic() < deadline:
        if router.sock.poll(50):
            router.drain()


def test_only_the_launch_client_key_is_admitted():
    keys = CurveKeys.generate()
    received: list[tuple[bytes, bytes]] = []
    router = ControlRouter("tcp://127.0.0.1:*", lambda i, m: received.append((i, m)), curve=keys)
    other = CurveKeys.generate()
    stranger = CurveKeys(keys.server_public, keys.server_secret,  # knows the server's key
                         other.client_public, other.client_secret)
    channels = [Channel(router.address, b"good@0", "good", curve=keys),
                Channel(router.address, b"bad@0", "bad", curve=stranger),
                Channel(router.address, b"plain@0", "plain")]  # no CURVE at all
    try:
        for channel in channels:
            try:  # not Channel.send: a DEALER whose handshake was already refused has no
                # pipe left, and a blocking send then waits forever (CI hung here once)
                channel.sock.send(encode(Ready(channel.sock.identity.decode(), {})), zmq.NOBLOCK)
            except zmq.Again:
                assert channel is not channels[0], "the admitted client could not send"
        _pump(router, received, 3.0, want=2)  # one is right; wait for a wrong second
        assert [i for i, _ in received] == [b"good@0"]
        assert decode(received[0][1]) == Ready("good@0", {})
        assert router.gatekeeper.refused >= 1  # the stranger's handshake was refused
        router.send(b"good@0", encode(Shutdown()))  # and the admitted one hears back
        assert channels[0].sock.poll(3000) and decode(channels[0].sock.recv()) == Shutdown()
    finally:
        for channel in channels:
            channel.sock.setsockopt(zmq.LINGER, 0)
            channel.close()
        router.close()


def test_plain_sockets_stay_on_loopback():
    with pytest.raises(ValueError, match="loopback"):
        check_address("tcp://10.1.2.3:5555")
    assert check_address("tcp://10.1.2.3:5555", authenticated=True) == "tcp://10.1.2.3:5555"
    assert check_address("tcp://127.0.0.1:*") == "tcp://127.0.0.1:*"


def test_keys_round_trip_and_file_is_private(tmp_path):
    keys = CurveKeys.generate()
    assert len({keys.server_public, keys.client_public}) == 2
    path = str(tmp_path / "keys.json")
    keys.write(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert CurveKeys.read(path) == keys
    with pytest.raises(ValueError, match="server_public"):
        CurveKeys.from_dict({"server_public": "x"})
    with pytest.raises(ValueError, match="40 characters"):
        CurveKeys.from_dict({**keys.to_dict(), "client_secret": "short"})
