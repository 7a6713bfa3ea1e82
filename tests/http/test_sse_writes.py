"""Streamed chat answers under load: the server writes the events of outputs that are
already queued in one socket write (omni/api/text.py); every event must still arrive
whole, once, in order, with the usage chunk and [DONE] last."""

from __future__ import annotations

import asyncio
import json

from httputil import one_stage

PIECES = 300  # one echo step each: the engine outruns the server's writes
STREAMS = 16


async def _stream(session, prompt: str) -> tuple[list[dict], list[bytes], int]:
    body = {"model": "many", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt}]}
    events, raw, batched = [], b"", 0
    async with session.post("/v1/chat/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for data, _ in resp.content.iter_chunks():
            raw += data
            batched += data.count(b"data: ") > 1
    blocks = [b for b in raw.split(b"\n\n") if b]
    assert blocks[-1] == b"data: [DONE]", blocks[-3:]
    for block in blocks[:-1]:
        assert block.startswith(b"data: "), block[:80]
        events.append(json.loads(block[len(b"data: "):]))
    return events, blocks, batched


def test_every_event_arrives_whole_once_and_in_order(start_server):
    server = start_server({"many": one_stage("many", options=f"{{chunks: {PIECES}}}")})
    # 9 characters a piece: the echo splits each prompt into PIECES equal pieces
    prompts = ["".join(f"s{s:02d}w{i:03d};" for i in range(PIECES)) for s in range(STREAMS)]

    async def go():
        async with server.session() as session:
            return await asyncio.gather(*(_stream(session, p) for p in prompts))

    results = asyncio.run(go())
    for prompt, (events, _, _) in zip(prompts, results, strict=True):
        deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]]
        assert len([d for d in deltas if d]) == PIECES  # one event a piece, none merged
        assert "".join(deltas) == prompt  # whole, once, in order
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        assert events[-1]["choices"] == [] and "total_tokens" in events[-1]["usage"]
        assert all(e["usage"] is None for e in events[:-1])
    # how many HTTP chunks carried more than one event (not asserted: it depends on how
    # far the server fell behind on this machine)
    print("chunks with several events:", sum(b for _, _, b in results))
