// The page's only way to the server: every call carries the API key (when one is set) and
// every failure becomes an Error whose message is the API's own (OpenAI error objects),
// never the browser's "Failed to fetch".

const KEY_STORE = "omni.apiKey";  // sessionStorage: asked once per tab, gone when it closes

export class ApiError extends Error {
  constructor(message, status = 0, param = null) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

export function apiKey() {
  return sessionStorage.getItem(KEY_STORE) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_STORE, key);
  else sessionStorage.removeItem(KEY_STORE);
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

// The error object's message (with the field it names), or the status line.
async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: the status line says what little there is
  }
  const error = body && body.error;
  if (error && error.message) return new ApiError(error.message, response.status, error.param);
  return new ApiError(`${response.status} ${response.statusText}`.trim(), response.status);
}

export async function request(path, { method = "GET", json, form, signal } = {}) {
  const init = { method, signal, headers: headers() };
  if (json !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  } else if (form !== undefined) {
    init.body = form;  // the browser writes the multipart boundary itself
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new ApiError("the server did not answer: is it still running?");
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson(path, options) {
  return (await request(path, options)).json();
}

// Server-sent events of a POST: yields each `data:` JSON object until [DONE] or the end.
// An event holding an `error` object ends the stream with that error (protocols.md §0).
export async function* postEvents(path, json, signal) {
  const response = await request(path, { method: "POST", json, signal });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;  // a keep-alive comment
      if (data === "[DONE]") return;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(event.error.message || "the stream failed");
      yield event;
    }
  }
}

// The realtime WebSocket: the key rides as a subprotocol, as OpenAI's browser clients send
// it (a browser's WebSocket cannot set headers).
export function realtimeSocket(model) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const protocols = ["realtime"];
  if (apiKey()) protocols.push(`openai-insecure-api-key.${apiKey()}`);
  return new WebSocket(`${scheme}://${location.host}/v1/realtime?model=${encodeURIComponent(model)}`,
    protocols);
}

export function base64FromBytes(bytes) {
  let text = "";
  const step = 0x8000;  // String.fromCharCode takes a bounded number of arguments
  for (let i = 0; i < bytes.length; i += step) {
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + step));
  }
  return btoa(text);
}

export function bytesFromBase64(data) {
  const text = atob(data);
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
  return bytes;
}

export function fileAsBase64(file) {
  return file.arrayBuffer().then((buffer) => base64FromBytes(new Uint8Array(buffer)));
}
