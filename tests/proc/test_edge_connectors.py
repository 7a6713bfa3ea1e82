"""An edge's `connector` decides where its producer's tensor payloads travel."""

from __future__ import annotations

import pytest
from procutil import Tap, collect, run, serving

from omni.config.pipeline import parse_pipeline


def pipeline(connector: str, payload_bytes: int):
    return parse_pipeline({"name": f"edge-{connector}", "stages": [
        {"name": "a", "engine": "echo",
         "params": {"chunks": 2, "payload_bytes": payload_bytes}},
        {"name": "b", "engine": "echo", "final_output": "text"},
    ], "edges": [{"from": "a", "to": "b", "connector": connector}]})


@pytest.mark.parametrize(("connector", "payload_bytes", "arena_puts"), [
    ("inline", 96 * 1024, 0),  # big, but the edge says inline: no arena at all
    ("shm", 1024, 2),  # small, but the edge says shm: both chunks through the arena
    ("auto", 1024, 0),  # small: inline
    ("auto", 96 * 1024, 2),  # big: the arena
])
def test_edge_connector_choice(connector: str, payload_bytes: int, arena_puts: int):
    async def body():
        async with serving(pipeline(connector, payload_bytes)) as omni:
            tap = Tap(omni)
            outputs = await collect(omni.generate({"prompt": "payloads"}))
            assert "".join(o.data["text"] for o in outputs if o.data) == "payloads"
            stats = [r.stats for r in tap.rows if r.stage == "a"][-1]
            assert stats.get("shm_puts", 0) == arena_puts, stats
    run(body())
