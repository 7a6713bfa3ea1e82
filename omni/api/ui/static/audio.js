// One AudioContext for the page (made on the first click: browsers start audio only
// after a user gesture), the microphone as pcm16 at a chosen rate, and a player of
// streamed pcm16. `stats` counts what was captured and played (the tests read it).

export const stats = { capturedSamples: 0, playedSamples: 0 };
let context = null;
let ready = null;

export async function audioContext() {
  if (!context) {
    context = new AudioContext();
    ready = context.audioWorklet.addModule("/ui/worklets.js");
  }
  await ready;
  if (context.state !== "running") await context.resume();
  return context;
}

// The microphone, resampled to `rate` on the audio thread; `onChunk(Int16Array)` gets
// 40 ms at a time. stop() lets the device go (the browser's recording dot goes out).
export class Microphone {
  constructor(rate, onChunk) {
    this.rate = rate;
    this.onChunk = onChunk;
  }

  async start() {
    const ctx = await audioContext();
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    this.source = ctx.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(ctx, "omni-capture", {
      numberOfInputs: 1, numberOfOutputs: 0, processorOptions: { rate: this.rate },
    });
    this.node.port.onmessage = (e) => {
      stats.capturedSamples += e.data.length;
      this.onChunk(e.data);
    };
    this.source.connect(this.node);
  }

  stop() {
    if (this.source) this.source.disconnect();
    if (this.node) this.node.port.onmessage = null;
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    this.source = this.node = this.stream = null;
  }
}

// Plays pcm16 chunks as they arrive; flush() drops what is queued (barge-in).
export class Player {
  async start() {
    const ctx = await audioContext();
    if (!this.node) {
      this.node = new AudioWorkletNode(ctx, "omni-player", { outputChannelCount: [1] });
      this.node.port.onmessage = (e) => { stats.playedSamples += e.data.played || 0; };
      this.node.connect(ctx.destination);
    }
    return this;
  }

  play(bytes, rate) {
    const pcm = new Int16Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >> 1);
    this.node.port.postMessage({ pcm: pcm.slice(0), rate });
  }

  flush() {
    if (this.node) this.node.port.postMessage({ flush: true });
  }
}

// pcm16 mono samples as a WAV file (a recording to upload for transcription).
export function wavBlob(chunks, rate) {
  const samples = chunks.reduce((n, c) => n + c.length, 0);
  const view = new DataView(new ArrayBuffer(44 + samples * 2));
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + samples * 2, true);
  text(8, "WAVEfmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true);  // PCM
  view.setUint16(22, 1, true);  // mono
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true);
  view.setUint16(32, 2, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, samples * 2, true);
  let at = 44;
  for (const chunk of chunks) {
    for (const s of chunk) { view.setInt16(at, s, true); at += 2; }
  }
  return new Blob([view.buffer], { type: "audio/wav" });
}
