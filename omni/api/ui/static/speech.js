// Speech (/v1/audio/speech: voice, format, speed; play and download) and Transcribe
// (/v1/audio/transcriptions of an uploaded or recorded file, segments with timestamps).

import { getJson, request } from "./api.js";
import { Microphone, wavBlob } from "./audio.js";
import { $, action, downloadName, el, fillSelect, showError } from "./dom.js";

const RECORD_RATE = 16000;  // what the recognizers hear anyway
let speechUrl = null;

async function loadVoices(model) {
  const select = $("speech-voice");
  try {
    const { voices } = await getJson(`/v1/audio/voices?model=${encodeURIComponent(model)}`);
    const ids = voices.map((v) => v.id);
    fillSelect(select, ids.length ? ids : ["alloy"], ids[0]);
  } catch (err) {
    fillSelect(select, ["alloy"]);  // the API maps OpenAI's names onto its own voices
    showError($("speech-error"), err);
  }
}

async function speak() {
  $("speech-result").hidden = true;
  const format = $("speech-format").value;
  const response = await request("/v1/audio/speech", { method: "POST", json: {
    model: $("speech-model").value, input: $("speech-text").value,
    voice: $("speech-voice").value, response_format: format,
    speed: Number($("speech-speed").value) || 1,
  } });
  const blob = await response.blob();
  if (speechUrl) URL.revokeObjectURL(speechUrl);
  speechUrl = URL.createObjectURL(blob);
  $("speech-audio").src = speechUrl;
  $("speech-download").href = speechUrl;
  $("speech-download").download = downloadName("speech", format);
  $("speech-result").hidden = false;
  await $("speech-audio").play().catch(() => {});  // a format the browser cannot play: download
}

export function setupSpeech(models, preferred) {
  fillSelect($("speech-model"), models.map((m) => m.id), preferred);
  loadVoices($("speech-model").value);
  $("speech-model").addEventListener("change", () => loadVoices($("speech-model").value));
  action($("speech-go"), $("speech-error"), speak);
}

function seconds(t) {
  return `${Number(t).toFixed(2)} s`;
}

function showTranscript(body) {
  $("transcribe-text").textContent = body.text;
  $("transcribe-segments").replaceChildren(...(body.segments || []).map((s) => el("li", {},
    el("span", { class: "time", textContent: `${seconds(s.start)} – ${seconds(s.end)}` }),
    el("span", { class: "text", textContent: s.text.trim() }))));
  $("transcribe-result").hidden = false;
}

export function setupTranscribe(models, preferred) {
  let recording = null;
  let recorded = null;
  fillSelect($("transcribe-model"), models.map((m) => m.id), preferred);

  $("transcribe-record").addEventListener("click", async () => {
    const button = $("transcribe-record");
    if (recording) {
      recording.mic.stop();
      recorded = wavBlob(recording.chunks, RECORD_RATE);
      $("transcribe-recorded").textContent =
        `Recorded ${seconds(recorded.size / 2 / RECORD_RATE)}`;
      recording = null;
      button.setAttribute("aria-pressed", "false");
      button.textContent = "● Record";
      return;
    }
    const chunks = [];
    const mic = new Microphone(RECORD_RATE, (pcm) => chunks.push(pcm));
    try {
      await mic.start();
    } catch (err) {
      showError($("transcribe-error"), err);
      return;
    }
    recording = { mic, chunks };
    button.setAttribute("aria-pressed", "true");
    button.textContent = "■ Stop recording";
    $("transcribe-recorded").textContent = "Recording…";
  });
  $("transcribe-file").addEventListener("change", () => {
    recorded = null;
    $("transcribe-recorded").textContent = "";
  });

  action($("transcribe-go"), $("transcribe-error"), async () => {
    $("transcribe-result").hidden = true;
    const file = recorded || $("transcribe-file").files[0];
    if (!file) throw new Error("choose an audio file or record one first");
    const form = new FormData();
    form.append("model", $("transcribe-model").value);
    form.append("response_format", "verbose_json");
    form.append("timestamp_granularities[]", "segment");
    if ($("transcribe-language").value.trim()) {
      form.append("language", $("transcribe-language").value.trim());
    }
    form.append("file", file, file.name || "recording.wav");
    showTranscript(await (await request("/v1/audio/transcriptions",
      { method: "POST", form })).json());
  });
}
