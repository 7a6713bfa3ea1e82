"""The default server's start-up: first start (SmolLM2 converted into an empty model
cache) and warm start, each to the first `GET /health` that answers 200, and the RSS of
the whole process tree once it serves (bench/probes/README.md). Prints one line per start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request


def _tree_rss_mib(pid: int) -> tuple[float, list[str]]:
    """RSS of `pid` and every descendant, MiB, and each process's share (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    total, todo, each = 0, [pid], []
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            name = open(f"/proc/{p}/cmdline").read().replace("\0", " ")[-40:].strip()
            for line in open(f"/proc/{p}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    each.append(f"{int(line.split()[1]) // 1024} MiB ({name})")
        except OSError:
            pass
    return total / 1024, each


def start(cache: str, port: int) -> str:
    env = {**os.environ, "OMNI_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "omni.server", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            time.sleep(0.1)
        ready = time.monotonic() - began
        total, each = _tree_rss_mib(proc.pid)
        return (f"{ready:.1f} s to /health ok; process tree RSS {total:.0f} MiB: "
                + "; ".join(each))
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as cache:
        print("first start (empty model cache):", start(cache, 8791), flush=True)
        for i in range(2):
            print(f"warm start {i + 1}:", start(cache, 8791), flush=True)
