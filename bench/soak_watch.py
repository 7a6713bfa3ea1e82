"""What the soak watches from outside the server: its process tree (/proc), its /dev/shm
blocks, its /health and /metrics; and the chaos: SIGKILL of a random engine replica.

Memory is the sum of PSS (smaps_rollup) over the tree, not of VmRSS: engines are forked
from one fork server that imported torch first, so their RSS counts the shared pages once
per process and a restarted replica's fresh copy-on-write pages would read as growth; PSS
splits each shared page among its users, so the sum is the tree's real footprint. VmRSS's
sum is recorded beside it.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any


def children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # the command name may hold spaces and parentheses: ppid follows the last ')'
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(root: int) -> list[int]:
    """root and every process below it."""
    tree, found, todo = children_by_parent(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, []))
    return found


def engine_pids(server: int) -> list[int]:
    """The engine replicas: the fork server's children (processes.py forks every engine
    from it); the fork server and the resource tracker themselves are not replicas."""
    tree = children_by_parent()
    for child in tree.get(server, []):
        if b"forkserver" in _read(f"/proc/{child}/cmdline"):
            return list(tree.get(child, []))
    return []


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _field_kib(text: bytes, name: bytes) -> int:
    found = re.search(rb"^" + name + rb":\s+(\d+) kB", text, re.M)
    return int(found.group(1)) if found else 0


def tree_memory(server: int) -> dict[str, Any]:
    """Sums over the tree, and each process's PSS under "pid:role" (which one grows)."""
    pss = rss = fds = 0
    pids = descendants(server)
    engines = set(engine_pids(server))
    by_pid = {}
    for pid in pids:
        one = _field_kib(_read(f"/proc/{pid}/smaps_rollup"), b"Pss") * 1024
        pss += one
        role = ("server" if pid == server else "engine" if pid in engines
                else "forkserver" if b"forkserver" in _read(f"/proc/{pid}/cmdline") else "other")
        by_pid[f"{pid}:{role}"] = one
        rss += _field_kib(_read(f"/proc/{pid}/status"), b"VmRSS") * 1024
        try:
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return {"processes": len(pids), "pss_bytes": pss, "rss_bytes": rss, "fds": fds,
            "pss_by_pid": by_pid}


def shm_blocks(server: int, since: float = float("inf"),
               shm_dir: str = "/dev/shm") -> dict[str, int]:
    """The server's payload arenas (omni-<server pid>-...): bytes really held (allocated
    blocks, not the apparent size) and how many; and the named semaphores made since
    `since` (multiprocessing's sem.mp-*: no owner in the name, so on a shared machine
    another program's count in too; reported, not judged)."""
    used = count = sems = 0
    prefix = f"omni-{server}-"
    for name in os.listdir(shm_dir):
        if name.startswith("sem."):
            sems += _mtime(os.path.join(shm_dir, name)) >= since
        elif name.startswith(prefix):
            try:
                used += os.stat(os.path.join(shm_dir, name)).st_blocks * 512
                count += 1
            except OSError:
                pass
    return {"shm_bytes": used, "shm_files": count, "sem_files": sems}


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def mapped_shm(pids: list[int]) -> set[str]:
    """/dev/shm files the processes map (arenas, named semaphores): what the tree holds
    there whatever its name, so what it leaves behind can be found after it exits."""
    names = set()
    for pid in pids:
        for line in _read(f"/proc/{pid}/maps").splitlines():
            if b" /dev/shm/" in line:
                names.add(line.split(b" /dev/shm/", 1)[1].split(b" ")[0].decode(errors="replace"))
    return names


def still_there(names: set[str], shm_dir: str = "/dev/shm") -> list[str]:
    return sorted(n for n in names if os.path.exists(os.path.join(shm_dir, n)))


ENGINE_BYTES = ("omni_replica_arena_used_bytes", "omni_replica_tensor_bytes")


def engine_bytes(metrics_text: str) -> int:
    """Bytes engines report holding (payload arenas in use, diffusion latents)."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(ENGINE_BYTES):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def health(session: Any, base: str) -> dict[str, Any]:
    """(served model, stage) -> {live, replicas, restarts}."""
    async with session.get(f"{base}/health") as resp:
        report = (await resp.json())["models"]
    return {(model, stage): s for model, r in report.items() for stage, s in r["stages"].items()}


def all_up(stages: dict[Any, Any]) -> bool:
    return all(s["live"] == s["replicas"] for s in stages.values())


class Victims:
    """Random replicas, each once before any twice (a shuffled bag of replica slots), so a
    short run still kills every stage; a slot follows its replica across restarts (the
    one new engine pid after a restart)."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}  # slot -> its replica's current pid
        self.bag: list[int] = []
        self.killing = -1  # the slot being killed

    def next(self, pids: list[int], rng: random.Random) -> int:
        if set(self.slots.values()) != set(pids):  # first call, or lost track: start over
            self.slots, self.bag = dict(enumerate(sorted(pids))), []
        if not self.bag:
            self.bag = list(self.slots)
            rng.shuffle(self.bag)
        self.killing = self.bag.pop()
        return self.slots[self.killing]

    def restarted(self, old: int, pids: list[int]) -> None:
        new = set(pids) - set(self.slots.values())
        if len(new) == 1 and self.slots.get(self.killing) == old:
            self.slots[self.killing] = new.pop()


@dataclass
class Watch:
    """Samples, kills and restarts, on the clock of time.monotonic() since `t0`."""

    server: int
    base: str
    t0: float = field(default_factory=time.monotonic)
    samples: list[dict[str, Any]] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    views: set[str] = field(default_factory=set)
    victims: Victims = field(default_factory=Victims)
    since: float = field(default_factory=time.time)  # the wall clock when watching began
    shm_seen: set[str] = field(default_factory=set)  # every /dev/shm file the tree mapped

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)

    async def stages(self, session: Any) -> dict[tuple[str, str], dict[str, int]]:
        return {k: v for k, v in (await health(session, self.base)).items()
                if k[0] not in self.views}

    async def sample_every(self, session: Any, every_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.sample(session)
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass

    async def sample(self, session: Any) -> None:
        t = self.now()
        memory = await asyncio.to_thread(tree_memory, self.server)
        shm = await asyncio.to_thread(shm_blocks, self.server, self.since)
        mapped = await asyncio.to_thread(mapped_shm, descendants(self.server))
        self.shm_seen |= mapped
        async with session.get(f"{self.base}/metrics") as resp:
            held = engine_bytes(await resp.text())
        stages = await self.stages(session)
        self.samples.append({"t": t, **memory, **shm, "shm_mapped": len(mapped),
                             "engine_bytes": held,
                             "all_up": all_up(stages),
                             "restarts": sum(s["restarts"] for s in stages.values())})

    async def kill_every(self, session: Any, every_s: float, stop: asyncio.Event,
                         rng: random.Random) -> None:
        """Every `every_s`, SIGKILL one random replica if every replica is up (so each
        failure can be traced to one kill), then wait for its restart."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every_s)
                return
            except TimeoutError:
                pass
            before = await self.stages(session)
            pids = engine_pids(self.server)
            if not all_up(before) or not pids:
                self.kills.append({"t": self.now(), "skipped": "not every replica was up"})
                continue
            pid = self.victims.next(pids, rng)
            kill = {"t": self.now(), "pid": pid}
            os.kill(pid, signal.SIGKILL)
            self.kills.append(kill)
            await self._await_restart(session, before, kill, stop)
            self.victims.restarted(pid, engine_pids(self.server))

    async def _await_restart(self, session: Any, before: dict, kill: dict,
                             stop: asyncio.Event) -> None:
        """Which stage the pid served: the one whose restart count moves; back = the
        first moment every replica is live again."""
        while not stop.is_set():
            await asyncio.sleep(0.25)
            now = await self.stages(session)
            moved = [k for k in now if now[k]["restarts"] > before.get(k, {}).get("restarts", 0)]
            if moved and "stage" not in kill:
                kill["stage"] = list(moved[0])
            if moved and all_up(now):
                kill["back"] = self.now()
                return
