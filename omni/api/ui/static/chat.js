// Chat: streamed /v1/chat/completions with any text model; image and audio attachments
// where the model takes them; "speak the answer" (modalities text+audio, pcm16 streamed
// and played as it comes) where the model speaks.

import { bytesFromBase64, fileAsBase64, postEvents } from "./api.js";
import { Player } from "./audio.js";
import { $, el, fillSelect, showError } from "./dom.js";

const PCM_RATE = 24000;  // streamed chat audio is pcm16 at 24 kHz (protocols.md §1.1)
const AUDIO_FORMATS = ["wav", "mp3", "flac", "ogg", "webm", "m4a"];

function audioFormat(file) {
  const ext = file.name.split(".").pop().toLowerCase();
  return AUDIO_FORMATS.includes(ext) ? ext : "wav";
}

async function userContent(text, image, audio) {
  if (!image && !audio) return text;
  const parts = text ? [{ type: "text", text }] : [];
  if (image) {
    const url = `data:${image.type || "image/png"};base64,${await fileAsBase64(image)}`;
    parts.push({ type: "image_url", image_url: { url } });
  }
  if (audio) {
    parts.push({ type: "input_audio",
      input_audio: { data: await fileAsBase64(audio), format: audioFormat(audio) } });
  }
  return parts;
}

function bubble(role, text, note) {
  const body = el("span", { class: "text", textContent: text });
  const line = el("li", { class: `msg ${role}` },
    el("span", { class: "who", textContent: role === "user" ? "You" : "Assistant" }), body,
    note ? el("span", { class: "note", textContent: note }) : null);
  $("chat-log").append(line);
  line.scrollIntoView({ block: "nearest" });
  return body;
}

export function setupChat(models, preferred) {
  const byId = Object.fromEntries(models.map((m) => [m.id, m]));
  const history = [];
  const player = new Player();
  let running = null;

  function fitControls() {
    const model = byId[$("chat-model").value];
    const takes = model.input_modalities || ["text"];
    $("chat-image-label").hidden = !takes.includes("image");
    $("chat-audio-label").hidden = !takes.includes("audio");
    $("chat-speak-label").hidden = !(model.modalities || []).includes("audio");
  }

  async function send() {
    const model = $("chat-model").value;
    const text = $("chat-text").value.trim();
    const image = !$("chat-image-label").hidden && $("chat-image").files[0];
    const audio = !$("chat-audio-label").hidden && $("chat-audio").files[0];
    const speak = !$("chat-speak-label").hidden && $("chat-speak").checked;
    if (!text && !image && !audio) throw new Error("write a message or attach a file first");
    const note = [image && `image: ${image.name}`, audio && `audio: ${audio.name}`]
      .filter(Boolean).join(" ");
    const message = { role: "user", content: await userContent(text, image, audio) };
    const body = { model, messages: [...history, message], stream: true };
    if (speak) {
      await player.start();  // in the click: browsers start audio on a gesture only
      Object.assign(body, { modalities: ["text", "audio"],
        audio: { voice: "alloy", format: "pcm16" } });
    }
    bubble("user", text, note);
    $("chat-text").value = "";
    $("chat-image").value = $("chat-audio").value = "";
    const answer = bubble("assistant", "");
    running = new AbortController();
    for await (const chunk of postEvents("/v1/chat/completions", body, running.signal)) {
      const delta = (chunk.choices[0] || {}).delta || {};
      if (delta.content) answer.textContent += delta.content;
      if (delta.audio && delta.audio.transcript) answer.textContent += delta.audio.transcript;
      if (delta.audio && delta.audio.data) player.play(bytesFromBase64(delta.audio.data), PCM_RATE);
    }
    history.push(message, { role: "assistant", content: answer.textContent });
  }

  fillSelect($("chat-model"), models.map((m) => m.id), preferred);
  fitControls();
  $("chat-model").addEventListener("change", fitControls);
  $("chat-clear").addEventListener("click", () => {
    history.length = 0;
    $("chat-log").replaceChildren();
  });
  $("chat-stop").addEventListener("click", () => {
    if (running) running.abort();
    player.flush();
  });
  $("chat-text").addEventListener("keydown", (e) => {  // Enter sends, Shift+Enter breaks
    if (e.key === "Enter" && !e.shiftKey) {
      e.preventDefault();
      $("chat-form").requestSubmit();
    }
  });
  $("chat-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    if ($("chat-send").disabled) return;
    showError($("chat-error"), null);
    $("chat-send").disabled = true;
    $("chat-stop").disabled = false;
    try {
      await send();
    } catch (err) {
      if (err.name !== "AbortError") showError($("chat-error"), err);
    } finally {
      $("chat-send").disabled = false;
      $("chat-stop").disabled = true;
      running = null;
    }
  });
}
