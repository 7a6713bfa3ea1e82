// Images (/v1/images/generations streamed: the denoiser's previews are the progress, the
// last event the picture) and Video (a /v1/videos job polled for its progress, the MP4
// played inline when done).

import { postEvents, request } from "./api.js";
import { $, action, downloadName, fillSelect } from "./dom.js";

const PREVIEWS = 3;  // partial images asked for (OpenAI's most); fewer with fewer steps
let videoUrl = null;

const optionalInt = (id) => ($(id).value.trim() === "" ? undefined : Number($(id).value));

function showImage(b64, caption, format) {
  $("images-result").src = `data:image/${format};base64,${b64}`;
  $("images-result").alt = `Generated: ${$("images-prompt").value}`;
  $("images-caption").textContent = caption;
  $("images-figure").hidden = false;
}

async function generateImage() {
  const steps = optionalInt("images-steps");
  const previews = Math.max(0, Math.min(PREVIEWS, (steps || 2) - 1));
  const progress = $("images-progress");
  $("images-figure").hidden = true;
  progress.max = previews + 1;
  progress.value = 0;
  progress.hidden = false;
  $("images-state").textContent = "Starting…";
  const started = performance.now();
  try {
    const events = postEvents("/v1/images/generations", {
      model: $("images-model").value, prompt: $("images-prompt").value,
      size: $("images-size").value, num_inference_steps: steps, seed: optionalInt("images-seed"),
      stream: true, partial_images: previews, output_format: "png",
    });
    for await (const event of events) {
      const format = event.output_format || "png";
      if (event.type.endsWith("partial_image")) {
        progress.value = event.partial_image_index + 1;
        $("images-state").textContent = `Preview ${event.partial_image_index + 1} of ${previews}`;
        showImage(event.b64_json, "preview", format);
      } else if (event.type.endsWith("completed")) {
        progress.value = progress.max;
        const took = ((performance.now() - started) / 1000).toFixed(1);
        $("images-state").textContent = `Done in ${took} s`;
        showImage(event.b64_json, `${event.size || ""} · ${took} s`, format);
      }
    }
  } finally {
    if (progress.value < progress.max) $("images-state").textContent = "";
  }
}

export function setupImages(models, preferred) {
  fillSelect($("images-model"), models.map((m) => m.id), preferred);
  action($("images-go"), $("images-error"), generateImage);
}

function pollDelay(response) {
  return Number(response.headers.get("openai-poll-after-ms")) || 1000;
}

async function showVideo(id) {
  const blob = await (await request(`/v1/videos/${id}/content`)).blob();
  if (videoUrl) URL.revokeObjectURL(videoUrl);
  videoUrl = URL.createObjectURL(blob);
  $("video-player").src = videoUrl;
  $("video-download").href = videoUrl;
  $("video-download").download = downloadName("video", "mp4");
  $("video-result").hidden = false;
  await $("video-player").play().catch(() => {});
}

async function generateVideo() {
  const progress = $("video-progress");
  $("video-result").hidden = true;
  progress.value = 0;
  progress.hidden = false;
  let response = await request("/v1/videos", { method: "POST", json: {
    model: $("video-model").value, prompt: $("video-prompt").value,
    size: $("video-size").value, seconds: $("video-seconds").value,
    num_inference_steps: optionalInt("video-steps"),
  } });
  let job = await response.clone().json();
  $("video-state").textContent = "Queued";
  while (job.status === "queued" || job.status === "in_progress") {
    await new Promise((resolve) => setTimeout(resolve, pollDelay(response)));
    response = await request(`/v1/videos/${job.id}`);
    job = await response.json();
    progress.value = job.progress || 0;
    $("video-state").textContent = job.status === "queued" ? "Queued" : `${job.progress || 0}%`;
  }
  if (job.status !== "completed") {
    throw new Error((job.error && job.error.message) || `the video job ${job.status}`);
  }
  progress.value = 100;
  $("video-state").textContent = "Done";
  await showVideo(job.id);
}

export function setupVideo(models, preferred) {
  fillSelect($("video-model"), models.map((m) => m.id), preferred);
  action($("video-go"), $("video-error"), generateVideo);
}
