"""The Responses API's pure parts: input items as chat messages (omni/api/response_items.py),
output items and their events built from an answer's parts (omni/api/response_output.py),
and the bounded store of kept responses (omni/api/response_store.py)."""

from __future__ import annotations

import gc
import json

import pytest

from omni.api import response_store
from omni.api.errors import APIError
from omni.api.response_items import called_ids, output_messages, to_messages
from omni.api.response_output import OutputItems
from omni.api.response_store import ResponseStore

CALL = {"type": "function_call", "call_id": "c1", "name": "get_time",
        "arguments": "{\"zone\": \"utc\"}", "id": "fc_1", "status": "completed"}


def test_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                     {"type": "input_text", "text": "b"}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
        CALL, {**CALL, "call_id": "c2", "name": "other"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "noon"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "done"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                     {"type": "input_image", "image_url": "data:x",
                                      "detail": "low"}]},
    ]
    called: set[str] = set()
    out = to_messages(items, called)
    assert out.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_time", "arguments": "{\"zone\": \"utc\"}"}},
            {"id": "c2", "type": "function",
             "function": {"name": "other", "arguments": "{\"zone\": \"utc\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "noon"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
        {"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}}]}]
    assert out.sources == [0, 1, 2, 6, 7, 8]
    assert called == {"c1", "c2"} == called_ids(out.messages)


def test_a_string_is_one_user_message_and_calls_stand_alone():
    assert to_messages("hi", set()).messages == [{"role": "user", "content": "hi"}]
    out = to_messages([{"role": "user", "content": "q"}, CALL], set())
    assert out.messages[1] == {"role": "assistant", "content": None,
                               "tool_calls": [{"id": "c1", "type": "function", "function": {
                                   "name": "get_time", "arguments": "{\"zone\": \"utc\"}"}}]}


def test_a_responses_output_is_the_assistants_turn():
    out = OutputItems()
    out.parts([{"content": "Sure."}, {"tool_call": {
        "index": 0, "id": "call_a", "function": {"name": "odd name!", "arguments": "{}"}}}])
    out.finish("stop")
    assert output_messages(out.items) == [{"role": "assistant", "content": "Sure.",
                                           "tool_calls": [{"id": "call_a", "type": "function",
                                                           "function": {"name": "odd name!",
                                                                        "arguments": "{}"}}]}]
    calls_only = OutputItems()
    calls_only.parts([{"tool_call": {"index": 0, "id": "call_b",
                                     "function": {"name": "f", "arguments": "{}"}}}])
    calls_only.finish("stop")
    assert output_messages(calls_only.items)[0]["content"] is None


def test_an_output_may_answer_a_call_of_the_stored_conversation():
    answer = {"type": "function_call_output", "call_id": "old", "output": "x"}
    with pytest.raises(APIError) as caught:
        to_messages([answer], set())
    assert caught.value.param == "input[0].call_id"
    assert to_messages([answer], {"old"}).messages[0]["tool_call_id"] == "old"


@pytest.mark.parametrize("item, param", [
    ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
    ({"type": "function_call", "call_id": "c", "name": "f"}, "input[0].arguments"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {}},
     "input[0].arguments"),
    ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
    ({"type": "file_search_call"}, "input[0].type"),
    ({"content": "no role or type"}, "input[0].type"),
    ({"role": "user"}, "input[0].content"),
    ({"role": "user", "content": [{"type": "input_audio"}]}, "input[0].content[0].type"),
    ({"role": "user", "content": [{"type": "input_text"}]}, "input[0].content[0].text"),
    ({"role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
     "input[0].content[0].image_url"),
])
def test_bad_items_name_their_path(item, param):
    with pytest.raises(APIError) as caught:
        to_messages([item], set())
    assert caught.value.status == 400 and caught.value.param == param


def _types(events):
    return [e["type"].removeprefix("response.") for e in events]


def test_text_then_calls_make_a_message_then_call_items():
    out = OutputItems()
    events = out.parts([{"content": "Let me "}, {"content": "check.\n"}])
    events += out.parts([{"tool_call": {"index": 0, "id": "call_a", "type": "function",
                                        "function": {"name": "f", "arguments": "{\"a\":"}}},
                         {"tool_call": {"index": 0, "function": {"arguments": " 1}"}}}])
    events += out.parts([{"content": "\n"}])  # between calls: not a message
    events += out.parts([{"tool_call": {"index": 1, "id": "call_b", "type": "function",
                                        "function": {"name": "g", "arguments": ""}}}])
    events += out.finish("stop")
    assert _types(events) == [
        "output_item.added", "content_part.added", "output_text.delta",
        "output_text.delta", "output_text.done", "content_part.done", "output_item.done",
        "output_item.added", "function_call_arguments.delta",
        "function_call_arguments.delta", "function_call_arguments.done", "output_item.done",
        "output_item.added", "function_call_arguments.done", "output_item.done"]
    message, first, second = out.items
    assert message["content"][0]["text"] == "Let me check."  # the held newline dropped
    assert events[0]["item"]["content"] == []
    assert first == {"type": "function_call", "id": first["id"], "call_id": "call_a",
                     "name": "f", "arguments": "{\"a\": 1}", "status": "completed"}
    assert events[7]["item"]["arguments"] == "" and events[7]["output_index"] == 1
    assert second["arguments"] == "" and events[-1]["output_index"] == 2
    assert all(item["status"] == "completed" for item in out.items)


def test_a_plain_answer_keeps_its_text_exactly_and_an_empty_one_has_a_message():
    out = OutputItems()
    events = out.parts([{"content": "  a \n"}, {"content": " b  "}]) + out.finish("length")
    assert out.items[0]["content"][0]["text"] == "  a \n b  "
    assert "".join(e["delta"] for e in events if e["type"].endswith(".delta")) == "  a \n b  "
    assert out.items[0]["status"] == "incomplete"
    empty = OutputItems()
    assert _types(empty.finish("stop")) == [
        "output_item.added", "content_part.added", "output_text.done", "content_part.done",
        "output_item.done"]
    assert empty.items[0]["content"][0]["text"] == ""


def test_the_store_bounds_count_bytes_and_age():
    now = [0.0]
    store = ResponseStore(max_responses=2, max_bytes=400, ttl_s=10, clock=lambda: now[0])
    for i in range(3):
        assert store.put({"id": f"r{i}"}, [{"role": "user", "content": "x"}])
    assert store.get("r0") is None and store.get("r1") is not None  # least recent out
    store.put({"id": "r3"}, [])  # r1 was used after r2: r2 goes
    assert set(store.entries) == {"r1", "r3"}
    assert not store.put({"id": "big"}, [{"content": "x" * 500}])  # alone over the cap
    store.put({"id": "fat"}, [{"content": "x" * 370}])
    assert set(store.entries) == {"fat"} and store.nbytes <= 400
    now[0] = 10.0
    assert store.get("fat") is None and store.nbytes == 0  # expired
    store.put({"id": "r4"}, [])
    assert store.delete("r4") and not store.delete("r4")


def _chain(store: ResponseStore, links: int) -> list[str]:
    """A conversation of ``links`` responses, each continuing the one before it (kept or
    evicted since), with a question and an answer of growing length."""
    previous, ids = None, []
    for i in range(links):
        response = {"id": f"r{i}", "output": [{"type": "message", "content": f"a{i}"}]}
        new = [{"role": "user", "content": f"question {i} " + "x" * i},
               {"role": "assistant", "content": f"answer {i}"}]
        store.put(response, new, previous)
        previous = store.get(response["id"]) or previous
        ids.append(response["id"])
    return ids


def test_a_long_chain_counts_only_its_new_messages(monkeypatch):
    """Each link of a chain adds its new messages' JSON to its previous one's count: the
    count is the whole conversation's JSON at every link, the work only the new messages'
    (not the whole conversation again at each link, O(N^2) over a chain), and the byte
    bound evicts the least recently used links as before."""
    dumps, serialized = json.dumps, []
    monkeypatch.setattr(response_store.json, "dumps",
                        lambda obj: serialized.append(len(text := dumps(obj))) or text)
    store = ResponseStore(max_responses=1_000, max_bytes=2**30)
    ids = _chain(store, 300)
    monkeypatch.undo()
    entries = [store.entries[i] for i in ids]
    assert len(entries[-1].messages) == 600 and entries[-1].messages[0]["content"] == "question 0 "
    for entry in entries:
        assert entry.nbytes == len(json.dumps(entry.response)) + len(json.dumps(entry.messages))
    assert store.nbytes == sum(e.nbytes for e in entries)
    assert sum(serialized) < 2 * entries[-1].nbytes  # recounting: ~150 times as much
    bound = 3 * entries[-1].nbytes  # a few of the last links fit
    bounded = ResponseStore(max_responses=1_000, max_bytes=bound)
    ids = _chain(bounded, 300)
    kept = list(bounded.entries)
    assert 1 < len(kept) < 300 and kept == ids[-len(kept):]  # the oldest links went first
    assert bounded.nbytes == sum(e.nbytes for e in bounded.entries.values()) <= bound
    one_more = entries[-len(kept) - 1].nbytes  # the same chain's next older link
    assert bounded.nbytes + one_more > bound
    assert bounded.entries["r299"].messages == entries[-1].messages  # whole, though r0 is gone


def _message_slots(store: ResponseStore) -> int:
    """The message references the store holds: the slots of every list reachable from its
    entries (through their dicts and dataclasses; the messages' own contents aside)."""
    seen, stack, slots = set(), [store.entries], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        slots += len(obj) if isinstance(obj, list) else 0
        if isinstance(obj, dict | list) or hasattr(obj, "__dataclass_fields__"):
            stack.extend(gc.get_referents(obj))
    return slots


def _flat_chain(links: int, max_responses: int = 1_000) -> tuple[ResponseStore, list]:
    """A chain of equal-sized links, and the whole conversation it makes."""
    store, previous, whole = ResponseStore(max_responses=max_responses), None, []
    for i in range(links):
        new = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        store.put({"id": f"r{i}"}, new, previous)
        previous = store.get(f"r{i}") or previous
        whole += new
    return store, whole


def test_a_chain_shares_its_conversation_and_keeps_it_whole_past_deletions():
    """A response continuing another holds its new messages and a link, not a copy of the
    conversation: a chain's references grow with its length, not its square (copied,
    400 links held 160,400 slots, 200 links 40,200). The history stays exact when the
    responses it continues are deleted or evicted."""
    short, _ = _flat_chain(200)
    long, whole = _flat_chain(400)
    assert _message_slots(short) >= 400 and _message_slots(long) >= 800  # it sees them
    assert _message_slots(long) < 2.2 * _message_slots(short)
    assert long.get("r399").messages == whole and long.get("r199").messages == whole[:400]
    for i in range(399):
        long.delete(f"r{i}")
    assert long.get("r399").messages == whole  # the links keep what the entries held
    evicting, whole = _flat_chain(400, max_responses=3)
    assert list(evicting.entries) == ["r397", "r398", "r399"]
    assert evicting.get("r399").messages == whole
    assert evicting.get("r398").messages == whole[:-2]
