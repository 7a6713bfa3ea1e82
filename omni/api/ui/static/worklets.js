// AudioWorklet processors (they run on the browser's audio thread): the microphone,
// resampled to the session's rate as pcm16, and a player of streamed pcm16 answers.
// `sampleRate` is the AudioContext's rate, a global of the worklet scope.

// Linear interpolation across block boundaries: position -1 is the previous block's last
// sample. Good enough for speech (voice activity and speech recognizers hear 16 kHz).
class Resampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate;
    this.pos = 0;
    this.last = 0;
  }

  push(input, emit) {
    let pos = this.pos;
    const end = input.length - 1;
    while (pos <= end) {
      const i = Math.floor(pos);
      const a = i < 0 ? this.last : input[i];
      const b = input[i + 1 <= end ? i + 1 : end];
      emit(a + (b - a) * (pos - i));
      pos += this.step;
    }
    this.pos = pos - input.length;
    this.last = input[end];
  }
}

class Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const rate = options.processorOptions.rate;
    this.resampler = new Resampler(sampleRate, rate);
    this.chunk = new Int16Array(Math.round(rate * 0.04));  // 40 ms a message
    this.fill = 0;
    this.emit = (x) => {
      const clipped = Math.max(-1, Math.min(1, x));
      this.chunk[this.fill++] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
      if (this.fill === this.chunk.length) {
        this.port.postMessage(this.chunk.slice(0));
        this.fill = 0;
      }
    };
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel && channel.length) this.resampler.push(channel, this.emit);
    return true;
  }
}

class Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.queue = [];  // Float32Arrays at the context's rate
    this.offset = 0;  // into queue[0]
    this.played = 0;  // output samples since the last report
    this.sinceReport = 0;
    this.port.onmessage = (e) => this.receive(e.data);
  }

  receive(message) {
    if (message.flush) {
      this.queue = [];
      this.offset = 0;
      this.report();
      return;
    }
    if (!this.resampler || this.rate !== message.rate) {
      this.rate = message.rate;
      this.resampler = new Resampler(message.rate, sampleRate);
    }
    const out = [];
    const pcm = message.pcm;
    const floats = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) floats[i] = pcm[i] / 0x8000;
    this.resampler.push(floats, (x) => out.push(x));
    this.queue.push(Float32Array.from(out));
  }

  report() {
    if (this.played) this.port.postMessage({ played: this.played * this.rate / sampleRate });
    this.played = 0;
    this.sinceReport = 0;
  }

  process(inputs, outputs) {
    const output = outputs[0][0];
    let written = 0;
    while (written < output.length && this.queue.length) {
      const head = this.queue[0];
      const n = Math.min(output.length - written, head.length - this.offset);
      output.set(head.subarray(this.offset, this.offset + n), written);
      written += n;
      this.offset += n;
      if (this.offset === head.length) {
        this.queue.shift();
        this.offset = 0;
      }
    }
    output.fill(0, written);
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(output);
    this.played += written;
    this.sinceReport += output.length;
    if (this.sinceReport >= sampleRate / 10 || (written && !this.queue.length)) this.report();
    return true;
  }
}

registerProcessor("omni-capture", Capture);
registerProcessor("omni-player", Player);
