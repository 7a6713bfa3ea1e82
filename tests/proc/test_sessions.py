"""Sessions on real engine processes (tiny Qwen3): a conversation's next turn prefills
only what is new while other requests fill the KV cache in between; closing and evicting
give the engine state back; capacity is refused at once; a killed replica ends its
sessions with an error; a cancelled turn keeps what it said."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from procutil import collect, replicas_of, run, serving, wait_until

from omni.config.pipeline import parse_pipeline
from omni.errors import RequestAbortedError
from omni.fixtures import build_tiny_qwen3
from omni.session import SessionCapacityError, SessionNotFoundError

PARAMS = {"llm": {"temperature": 0, "max_tokens": 8, "ignore_eos": True}}
OPTIONS = {"kv_cache_blocks": 64, "block_size": 4, "max_num_seqs": 4}


def pipeline(model_dir, **sessions):
    return parse_pipeline({"name": "chat", "sessions": {"max_sessions": 2, **sessions},
                           "stages": [{"name": "llm", "engine": "ar", "model_dir": model_dir,
                                       "final_output": "text", "options": OPTIONS}]})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # a larger init than the default, so greedy answers vary (with 0.02 they repeat one token)
    return str(build_tiny_qwen3(tmp_path_factory.mktemp("sessions") / "qwen3",
                                initializer_range=0.5))


def first(outputs, key):
    return next(o.data[key] for o in outputs if o.data and key in o.data)


def text(outputs):
    return "".join(o.data.get("text", "") for o in outputs if o.data)


async def pressure(omni, rounds=5):
    """Distinct prompts that, one after another, take every block of the cache."""
    for i in range(rounds):
        ids = [(7 * i + j) % 90 + 5 for j in range(200)]
        await collect(omni.generate({"prompt_token_ids": ids},
                                    params={"llm": {"max_tokens": 2}}))


def test_next_turn_prefills_only_new_tokens_and_close_frees_state(model_dir):
    async def body():
        async with serving(pipeline(model_dir)) as omni:
            session = omni.open_session()
            omni.append(session.id, {"role": "user", "content": "Tell me about the sea."})
            turn1 = await collect(omni.respond(session.id, params=PARAMS))
            prompt1 = first(turn1, "prompt_tokens")
            assert len(set(text(turn1))) > 3  # the tiny model's answer varies
            await wait_until(lambda: session.nbytes > 0, what="session bytes reported")
            await pressure(omni)
            omni.append(session.id, {"role": "user", "content": "And the mountains?"})
            turn2 = await collect(omni.respond(session.id, params=PARAMS))
            assert first(turn2, "cached_tokens") >= prompt1  # the whole first turn reused
            history = session.state["conversation"].messages[:3]
            assert omni.close_session(session.id)
            llm = replicas_of(omni)[0]
            await wait_until(lambda: llm.stats.get("session_bytes") == {},
                             what="the engine to free the session's blocks")
            assert session.nbytes == 0 and omni.sessions.manager.held_bytes == 0
            # the same conversation as a plain request after the same pressure: cold
            await pressure(omni)
            plain = await collect(omni.generate({"messages": history}, params=PARAMS))
            assert first(plain, "cached_tokens") == 0
    run(body(), timeout_s=120)


def test_capacity_budget_eviction_and_reset(model_dir):
    async def body():
        async with serving(pipeline(model_dir)) as omni:
            a, b = omni.open_session(), omni.open_session()
            with pytest.raises(SessionCapacityError):
                omni.open_session()
            manager = omni.sessions.manager
            assert manager.byte_budget > 0  # half the KV cache by default
            for s in (a, b):
                omni.append(s.id, {"role": "user", "content": "Hello there, how are you?"})
                await collect(omni.respond(s.id, params=PARAMS))
            await wait_until(lambda: a.nbytes > 0 and b.nbytes > 0, what="bytes")
            manager.byte_budget = max(a.nbytes, b.nbytes)  # room for one of them
            manager.fit_budget()  # a is the least recently used: its state goes
            llm = replicas_of(omni)[0]
            await wait_until(lambda: set(llm.stats["session_bytes"]) == {b.id},
                             what="the engine to drop the evicted session")
            assert manager.evictions == 1 and len(manager) == 2  # evicted, still open
            omni.signal(b.id, "reset")
            await wait_until(lambda: llm.stats["session_bytes"] == {}, what="reset")
            assert b.state["conversation"].messages == []
    run(body(), timeout_s=120)


def test_cancel_keeps_what_was_said_and_a_killed_replica_ends_sessions(model_dir):
    async def body():
        async with serving(pipeline(model_dir)) as omni:
            session = omni.open_session()
            ended = []
            session.on_end.append(lambda s, reason: ended.append(reason))
            omni.append(session.id, {"role": "user", "content": "Count to a thousand."})
            got = []
            with pytest.raises(RequestAbortedError):
                async for out in omni.respond(session.id, params={
                        "llm": {"max_tokens": 400, "ignore_eos": True}}):
                    got.append(out)
                    if len(got) == 3:
                        omni.signal(session.id, "cancel")
            said = session.state["conversation"].messages[-1]
            assert said["role"] == "assistant" and said["content"] == text(got)
            llm = replicas_of(omni)[0]
            os.kill(llm.process.pid, signal.SIGKILL)
            await wait_until(lambda: bool(ended), timeout_s=10, what="the session to end")
            assert "died" in ended[0]
            with pytest.raises(SessionNotFoundError):
                omni.append(session.id, {"role": "user", "content": "Still there?"})
            await asyncio.sleep(0)
    run(body(), timeout_s=120)
