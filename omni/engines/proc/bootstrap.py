"""Run by a stage's own interpreter as a script: the engine process entry point, with omni
found where the environment has it, else on the server's path.

    ENV/bin/python .../omni/engines/proc/bootstrap.py OMNI_PATH REPLICA_ID

The server (omni/runtime/env_process.py) starts it; the spec follows on stdin (stdin.py).
An environment with omni installed runs its own (the handshake refuses one of another
wire version, naming the fix); one without gets OMNI_PATH appended to its path and to
PYTHONPATH (for processes the engine starts), a directory that holds only the server's
omni package, so none of the server's other libraries leak into the environment.
REPLICA_ID is unused: it names the process in `ps`.

Standard library only, and no `omni` import before the path is settled.
"""

import importlib.util
import os
import signal
import sys


def main() -> None:
    # the server owns shutdown: a terminal's Ctrl-C reaches the whole process group, and the
    # engine waits for the server's Shutdown (as run_engine_process does, from here on: the
    # imports before it take seconds)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # this file's directory was put first on the path: its modules (main, loop, spec, ...)
    # must not shadow top-level ones of the environment
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    omni_path = sys.argv[1]
    if importlib.util.find_spec("omni") is None:
        sys.path.append(omni_path)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.environ.get("PYTHONPATH"), omni_path) if p)
    elif importlib.util.find_spec("omni.engines.proc.stdin") is None:
        sys.exit(f"omni engine: the omni installed in {sys.prefix} is older than the "
                 "server's and cannot be started by it: reinstall omni in that environment "
                 "(pip install --no-deps, or scripts/make_stage_env.sh)")
    from omni.engines.proc.__main__ import main as engine_main

    engine_main(["--spec-stdin"])


if __name__ == "__main__":
    main()
