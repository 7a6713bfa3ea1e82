"""`python -m omni.server` stopped with SIGTERM: the server exits only after every process
it started (engines, the fork server, the resource tracker), leaves no control directory
or socket file behind and reports no leaked resource; a SIGKILLed server's leftovers are
swept by the next start."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import tempfile

import pytest


def _start(tmp: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": tmp}
    process = subprocess.Popen(
        [sys.executable, "-m", "omni.server", "--pipeline", "echo", "--pipeline", "echo_chain",
         "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)  # its own process group: everything it starts is in it
    for line in process.stdout:
        if "listening on" in line:
            return process
    process.wait(10)
    pytest.fail(f"server did not start (exit {process.returncode})")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)  # zombies count: a child not yet reaped is still there
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(120)
def test_sigterm_leaves_no_process_socket_or_leak():
    with tempfile.TemporaryDirectory() as tmp:
        server = _start(tmp)
        assert glob.glob(os.path.join(tmp, "omni-ipc-*", "*.sock"))  # the control sockets
        server.send_signal(signal.SIGTERM)
        rest = server.stdout.read()
        assert server.wait(60) == 0, rest
        alive = _group_alive(server.pid)  # at the moment the server has exited
        if alive:
            os.killpg(server.pid, signal.SIGKILL)
        assert not alive, "a process of the server's group outlived it"
        assert "stopped" in rest
        assert "leaked" not in rest, rest
        assert os.listdir(tmp) == []  # no control directory, no socket file


@pytest.mark.timeout(120)
def test_a_sigkilled_servers_leftovers_are_swept_at_the_next_start():
    with tempfile.TemporaryDirectory() as tmp:
        killed = _start(tmp)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(10)
        left = glob.glob(os.path.join(tmp, f"omni-ipc-{killed.pid}-*"))
        assert left  # what a SIGKILLed server cannot remove
        # an arena of that launch, as a producer killed with it leaves one (echo stages
        # make none of their own)
        arena = f"/dev/shm/omni-{killed.pid}-abcdef-s-0-0001"
        with open(arena, "wb") as f:
            f.write(b"\0" * 4096)
        left.append(arena)
        server = _start(tmp)
        try:
            assert not any(os.path.exists(path) for path in left)
        finally:
            server.send_signal(signal.SIGTERM)
            server.stdout.read()
            server.wait(60)
