"""ZeroMQ CURVE keys for sockets that leave the host: the control plane and data sockets.

A server start that places replicas on other hosts makes one set of keys (`CurveKeys.
generate`): a server pair for every socket that binds (the orchestrator's remote control
ROUTER, each producer's data socket) and a client pair for every socket that connects.
Replicas get the set with their spec (through Ray's task arguments, or a key file for
`python -m omni.engines.proc`). Every binding socket runs a ZAP check that admits only
the set's client key, so a peer with another key, or none, completes no handshake and
is never read; CURVE encrypts everything after the handshake. Keys live only in memory
and in the specs handed to replicas; a new server start makes new ones. A peer holding
keys of another start does not even know this server's public key: its handshake fails
before the ZAP check (libzmq counts it as a handshake failure; no log line here).

Why one client key for all replicas, not one per replica: every replica of a launch is
equally trusted (each may connect to any producer's data socket), and a per-replica key
would need a key list that grows with restarts on every binding socket.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

import zmq

log = logging.getLogger("omni.wire.curve")

ZAP_DOMAIN = "omni"


@dataclass(frozen=True)
class CurveKeys:
    """Z85 text of the four keys (40 characters each)."""

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def generate(cls) -> CurveKeys:
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support: replicas on other hosts "
                               "cannot be authenticated (install pyzmq's wheel, which has it)")
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), server_secret.decode(),
                   client_public.decode(), client_secret.decode())

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> CurveKeys:
        if not isinstance(data, dict) or set(data) != {
                "server_public", "server_secret", "client_public", "client_secret"}:
            raise ValueError("CURVE keys: expected a map of server_public, server_secret, "
                             "client_public, client_secret")
        for name, value in data.items():
            if not isinstance(value, str) or len(value) != 40:
                raise ValueError(f"CURVE key {name}: expected 40 characters of Z85 text")
        return cls(**data)

    def write(self, path: str) -> None:
        """A key file only its owner can read (for replicas started by hand)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def read(cls, path: str) -> CurveKeys:
        with open(path) as f:
            return cls.from_dict(json.load(f))


def serve_curve(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make a binding socket a CURVE server (set before bind)."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.server_public.encode())
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler: refuse, never admit


def connect_curve(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make a connecting socket a CURVE client of the set's server key (set before
    connect)."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret.encode())


class _AllowClientKey:
    """ZAP credentials provider: admits the set's client key only."""

    def __init__(self, keys: CurveKeys) -> None:
        self.allowed = keys.client_public.encode()
        self.refused = 0

    def callback(self, domain: str, client_key: bytes) -> bool:
        if client_key == self.allowed:
            return True
        self.refused += 1
        if self.refused <= 10:  # a misconfigured replica retries: say it, not forever
            log.warning("refused a CURVE handshake: client key %s... is not this launch's "
                        "(the peer knows the server's key but not the client key)",
                        client_key[:8].decode(errors="replace"))
        return False


class Gatekeeper:
    """The ZAP handler of one ZeroMQ context: every CURVE server socket of that context
    admits only the set's client key. One per context; stop() before context.term()."""

    def __init__(self, context: zmq.Context, keys: CurveKeys) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        self.provider = _AllowClientKey(keys)
        self.auth = ThreadAuthenticator(context, log=logging.getLogger("omni.wire.curve.zap"))
        self.auth.start()
        self.auth.configure_curve_callback(domain=ZAP_DOMAIN,
                                           credentials_provider=self.provider)

    @property
    def refused(self) -> int:
        return self.provider.refused

    def stop(self) -> None:
        self.auth.stop()
