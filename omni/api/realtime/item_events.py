"""The ``conversation.item.*`` events of a realtime connection: create, delete,
retrieve, truncate (a mixin of RealtimeConnection, connection.py).

A ``function_call_output`` answers a call of this conversation: one whose call_id no
``function_call`` item holds is refused, as a ``tool`` message answering no call would
be in chat completions. A ``function_call`` the client creates (its own history,
replayed) must not reuse a call_id. Deleting a call leaves its output, if any, where it
is: the client said which items go. A call cannot be truncated (it has no audio).

An item with ``input_image`` parts is refused whole (nothing added) when the model takes
no images (its card's input_modalities), when an image is not one the server reads (the
checks of chat completions' image_url parts), or when the conversation would hold more
than MAX_IMAGE_BYTES of images.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import omni.api.realtime.audio_input as audio_input
from omni.api.chat_media import load_image
from omni.api.realtime.config import ClientError
from omni.api.realtime.items import MAX_IMAGE_BYTES, Item, Items, user_item
from omni.media.fetch import FetchPolicy

PCM_BYTES_PER_MS = 48  # pcm16 at 24 kHz, both ways


class ItemEvents:
    """conversation.item.* handlers; the connection provides what is declared here."""

    items: Items
    listener: Any
    model: Any
    media_policy: FetchPolicy  # how image URLs are loaded (the server's --media-fetch)

    async def send(self, event: dict[str, Any]) -> None: ...
    def _transcribe(self, item: Item, pcm16k: bytes) -> None: ...

    async def _item_added(self, item: Item, previous: str | None) -> None:
        await self.send({"type": "conversation.item.added", "previous_item_id": previous,
                         "item": item})
        await self.send({"type": "conversation.item.done", "previous_item_id": previous,
                         "item": item})

    async def item_create(self, event: dict[str, Any]) -> None:
        try:
            item = user_item(event.get("item"))
            self._check_call(item)
            await self._load_images(item)
            audio = [p.pop("audio") for p in item.parts if "audio" in p]
            if audio and audio[0] and item.role == "assistant":  # its length, to truncate
                item.audio_ms = len(decode_pcm(audio[0], "input_audio.audio")) // PCM_BYTES_PER_MS
            previous = self.items.add(item, event.get("previous_item_id"))
        except KeyError:
            raise ClientError("previous_item_id names no item", "item_not_found",
                              "previous_item_id") from None
        except ValueError as exc:
            raise ClientError(str(exc), "invalid_item", "item") from None
        await self._item_added(item, previous)
        if audio and audio[0] and item.role == "user":
            if self.listener is None:
                raise ClientError(f"model '{self.model.id}' does not take audio input",
                                  "unsupported_input")
            buffer = audio_input.InputAudio(30.0)
            try:
                pcm16k = buffer.append(decode_pcm(audio[0], "input_audio.audio"))
            except ValueError as exc:
                raise ClientError(f"input_audio.audio: {exc}", "invalid_audio") from None
            self._transcribe(item, pcm16k)

    async def _load_images(self, item: Item) -> None:
        """The files of the item's input_image parts, checked; ClientError otherwise."""
        where = [f"item.content[{j}]" for j, part in enumerate(item.parts)
                 if part["type"] == "input_image"]
        if where and "image" not in self.model.input_modalities:
            raise ClientError(f"model '{self.model.id}' does not take image input (it takes "
                              f"{', '.join(self.model.input_modalities)})",
                              "unsupported_input", where[0])
        urls = [p["image_url"] for p in item.parts if p["type"] == "input_image"]
        for param, url in zip(where, urls, strict=True):
            try:
                item.images.append(await load_image(url, self.media_policy))
            except ValueError as exc:
                raise ClientError(f"{param}: {exc}", "invalid_image", param) from None
        if where and self.items.image_bytes() + sum(map(len, item.images)) > MAX_IMAGE_BYTES:
            raise ClientError(f"the conversation would hold more than {MAX_IMAGE_BYTES} bytes "
                              "of images; delete some items (conversation.item.delete)",
                              "invalid_image", where[0])

    def _check_call(self, item: Item) -> None:
        """An output answers a call of this conversation; a replayed call is a new one."""
        if item.type == "message":
            return
        known = item.call["call_id"] in self.items.call_ids()
        if item.type == "function_call_output" and not known:
            raise ClientError(f"call_id {item.call['call_id']!r} names no function_call item "
                              "of this conversation", "item_not_found", "item.call_id")
        if item.type == "function_call" and known:
            raise ClientError(f"call_id {item.call['call_id']!r} is already a function_call "
                              "of this conversation", "invalid_value", "item.call_id")

    async def item_delete(self, event: dict[str, Any]) -> None:
        try:
            self.items.delete(event.get("item_id"))
        except KeyError:
            raise ClientError("item_id names no item", "item_not_found", "item_id") from None
        await self.send({"type": "conversation.item.deleted", "item_id": event["item_id"]})

    async def item_retrieve(self, event: dict[str, Any]) -> None:
        try:
            item = self.items.get(event.get("item_id"))
        except KeyError:
            raise ClientError("item_id names no item", "item_not_found", "item_id") from None
        await self.send({"type": "conversation.item.retrieved", "item": item})

    async def item_truncate(self, event: dict[str, Any]) -> None:
        """Cut an assistant's audio where the client stopped playing it. As OpenAI's, the
        item's transcript goes too: nothing the user did not hear stays in what the next
        answer reads."""
        try:
            item = self.items.get(event.get("item_id"))
        except KeyError:
            raise ClientError("item_id names no item", "item_not_found", "item_id") from None
        index, end = event.get("content_index", 0), event.get("audio_end_ms")
        item.truncate(index, end)
        await self.send({"type": "conversation.item.truncated", "item_id": item.id,
                         "content_index": index, "audio_end_ms": end})


def decode_pcm(data: Any, param: str) -> bytes:
    """Base64 audio of an event; ClientError (invalid_audio) when it is not base64."""
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ClientError(f"{param}: {exc}", "invalid_audio", param) from None
