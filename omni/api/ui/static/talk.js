// Talk: a /v1/realtime voice session. The microphone goes up as pcm16 at the session's
// rate (input_audio_buffer.append); the server's VAD finds the turns and answers; the
// answer's audio is played as it streams and both sides' transcripts show live. Speaking
// over an answer interrupts it (the server cancels it; the page drops what is queued).

import { base64FromBytes, bytesFromBase64, getJson, realtimeSocket } from "./api.js";
import { Microphone, Player } from "./audio.js";
import { $, el, fillSelect, showError } from "./dom.js";

const DEFAULT_RATE = 24000;  // the realtime API's pcm16 rate when the session names none
const VOICE_HINT = "Speak; the server hears when you stop and answers aloud. Speak over the "
  + "answer to interrupt it. Or type a turn below.";
const TYPED_HINT = "This model does not hear: type your turns below (one realtime session).";

// The transcript: one line per conversation item, filled as deltas arrive.
class Transcript {
  constructor(list) {
    this.list = list;
    this.lines = new Map();
  }

  text(id, role) {
    let line = this.lines.get(id);
    if (!line) {
      line = el("li", { class: `msg ${role}` },
        el("span", { class: "who", textContent: role === "user" ? "You" : "Assistant" }),
        el("span", { class: "text" }));
      this.lines.set(id, line);
      this.list.append(line);
    }
    line.scrollIntoView({ block: "nearest" });
    return line.querySelector(".text");
  }

  add(id, role, delta) { this.text(id, role).textContent += delta; }

  set(id, role, text) { this.text(id, role).textContent = text; }

  note(id, text) {
    const line = this.lines.get(id);
    if (line) line.append(el("span", { class: "note", textContent: text }));
  }
}

function inputText(item) {
  const part = (item.content || []).find((p) => p.type === "input_text" || p.type === "text");
  return part ? part.text : "";
}

class Session {
  constructor(model, view) {
    this.model = model;
    this.view = view;
    this.player = new Player();
    this.rate = this.outRate = DEFAULT_RATE;
    this.handlers = this.eventHandlers();
  }

  async connect() {
    // a refused upgrade tells a browser nothing: ask the API first, for its own message
    await getJson(`/v1/models/${encodeURIComponent(this.model)}`);
    await this.player.start();
    this.ws = realtimeSocket(this.model);
    await new Promise((resolve, reject) => {
      this.ws.onmessage = (e) => {
        const event = JSON.parse(e.data);
        if (event.type === "session.created") resolve();
        this.receive(event);
      };
      this.ws.onclose = (e) => {
        reject(new Error(`the realtime session closed (${e.code}) ${e.reason}`.trim()));
        this.closed(e);
      };
    });
  }

  get open() { return this.ws && this.ws.readyState === WebSocket.OPEN; }

  send(event) { if (this.open) this.ws.send(JSON.stringify(event)); }

  receive(event) {
    const handler = this.handlers[event.type];
    if (handler) handler(event);
  }

  eventHandlers() {
    const t = this.view.transcript;
    const assistantText = (e) => t.add(e.item_id, "assistant", e.delta);
    const audio = (e) => {
      this.view.state("Speaking…");
      this.player.play(bytesFromBase64(e.delta), this.outRate);
    };
    return {
      "session.created": (e) => this.configure(e.session),
      "input_audio_buffer.speech_started": (e) => {
        this.player.flush();  // barge-in: stop playing the answer being spoken over
        this.view.state("Listening…");
        t.text(e.item_id, "user");
      },
      "input_audio_buffer.speech_stopped": () => this.view.state("Thinking…"),
      "conversation.item.added": (e) => this.item(e.item),
      "conversation.item.created": (e) => this.item(e.item),
      "conversation.item.input_audio_transcription.delta": (e) => t.add(e.item_id, "user", e.delta),
      "conversation.item.input_audio_transcription.completed":
        (e) => t.set(e.item_id, "user", e.transcript),
      "conversation.item.input_audio_transcription.failed":
        (e) => t.set(e.item_id, "user", `(not understood: ${e.error.message})`),
      "response.output_audio_transcript.delta": assistantText,
      "response.audio_transcript.delta": assistantText,
      "response.output_text.delta": assistantText,
      "response.text.delta": assistantText,
      "response.output_audio.delta": audio,
      "response.audio.delta": audio,
      "response.done": (e) => this.done(e.response),
      error: (e) => showError(this.view.error, e.error),
    };
  }

  configure(session) {
    const audio = session.audio || {};
    const input = audio.input || {};
    this.rate = (input.format && input.format.rate) || DEFAULT_RATE;
    this.outRate = (audio.output && audio.output.format && audio.output.format.rate) || this.rate;
    this.serverVad = Boolean(input.turn_detection || session.turn_detection);
    this.view.state("Connected");
  }

  item(item) {
    if (item.type !== "message") return;
    const text = inputText(item);
    if (text) this.view.transcript.set(item.id, item.role, text);
    else this.view.transcript.text(item.id, item.role);
  }

  done(response) {
    const details = response.status_details || {};
    if (response.status === "cancelled") {  // spoken over (or cancelled): say so on the line
      const why = details.reason === "turn_detected" ? "interrupted" : "cancelled";
      for (const item of response.output || []) this.view.transcript.note(item.id, why);
    }
    if (response.status === "failed" && details.error) showError(this.view.error, details.error);
    this.view.state(this.mic ? "Listening" : "Connected");
  }

  async startMic() {
    this.mic = new Microphone(this.rate, (pcm) => this.send({
      type: "input_audio_buffer.append",
      audio: base64FromBytes(new Uint8Array(pcm.buffer)),
    }));
    await this.mic.start();
    this.view.state("Listening");
  }

  stopMic() {
    if (!this.mic) return;
    this.mic.stop();
    this.mic = null;
    if (!this.serverVad) {  // no VAD: the end of recording is the end of the turn
      this.send({ type: "input_audio_buffer.commit" });
      this.send({ type: "response.create" });
    }
    this.view.state("Connected");
  }

  say(text) {
    this.send({ type: "conversation.item.create",
      item: { type: "message", role: "user", content: [{ type: "input_text", text }] } });
    this.send({ type: "response.create" });
  }

  close() {
    this.stopMic();
    if (this.ws) this.ws.close(1000);
  }

  closed(event) {
    this.stopMic();
    this.player.flush();
    this.view.closed(event);
  }
}

export function setupTalk(models, preferred) {
  const button = $("talk-mic");
  const view = {
    transcript: new Transcript($("talk-log")),
    error: $("talk-error"),
    state: (text) => { $("talk-state").textContent = text; },
    closed: (event) => {
      view.state("Not connected");
      setPressed(false);
      if (event.code !== 1000 && event.code !== 1005) {
        showError(view.error, new Error(
          `the realtime session closed (${event.code})${event.reason ? `: ${event.reason}` : ""}`));
      }
    },
  };
  let session = null;
  const setPressed = (on) => {
    button.setAttribute("aria-pressed", String(on));
    button.textContent = on ? "■ Stop talking" : "● Start talking";
  };

  async function connected() {
    if (session && session.open && session.model === $("talk-model").value) return session;
    if (session) session.close();
    view.state("Connecting…");
    session = new Session($("talk-model").value, view);
    await session.connect();
    return session;
  }

  async function guarded(run) {
    showError(view.error, null);
    try {
      await run();
    } catch (err) {
      showError(view.error, err);
      if (!session || !session.open) view.state("Not connected");
    }
  }

  const hears = Object.fromEntries(models.map((m) => [m.id,
    (m.input_modalities || []).includes("audio")]));
  const fitControls = () => {  // a model that does not hear gets typed turns only
    button.hidden = !hears[$("talk-model").value];
    $("talk-hint").textContent = button.hidden ? TYPED_HINT : VOICE_HINT;
  };
  fillSelect($("talk-model"), models.map((m) => m.id), preferred);
  fitControls();
  $("talk-model").addEventListener("change", () => {
    if (session) session.close();
    fitControls();
  });
  button.addEventListener("click", () => guarded(async () => {
    if (session && session.mic) {
      session.stopMic();
      setPressed(false);
      return;
    }
    setPressed(true);
    try {
      await (await connected()).startMic();
    } catch (err) {
      setPressed(false);
      throw err;
    }
  }));
  $("talk-form").addEventListener("submit", (e) => guarded(async () => {
    e.preventDefault();
    const text = $("talk-text").value.trim();
    if (!text) return;
    (await connected()).say(text);
    $("talk-text").value = "";
  }));
}
