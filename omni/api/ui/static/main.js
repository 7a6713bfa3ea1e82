// The playground's entry: ask for the API key when the server wants one, read what it
// serves (/v1/models), show the tabs those models' modalities allow, start the status strip.

import { ApiError, getJson, setApiKey } from "./api.js";
import { stats } from "./audio.js";
import { $, showError } from "./dom.js";
import { setupChat } from "./chat.js";
import { setupImages, setupVideo } from "./media.js";
import { setupSpeech, setupTranscribe } from "./speech.js";
import { startStatus } from "./status.js";
import { setupTalk } from "./talk.js";

const has = (list, x) => (list || []).includes(x);
const inputs = (m) => m.input_modalities || ["text"];

const only = (list, x) => (list || []).length === 1 && list[0] === x;

// tab -> which models it offers. Speech and Transcribe take the single-purpose models: a
// model that answers (the default assistant) speaks its own answers and reads no text aloud,
// and hears questions rather than transcribing (its 400s say so)
const TABS = {
  // any model that answers; the microphone where it hears, a voice model first
  talk: { fits: (m) => has(inputs(m), "text") && has(m.modalities, "text"),
    order: (m) => -has(inputs(m), "audio") - has(m.modalities, "audio"), setup: setupTalk },
  chat: { fits: (m) => has(inputs(m), "text") && has(m.modalities, "text"), setup: setupChat },
  speech: { fits: (m) => has(inputs(m), "text") && only(m.modalities, "audio"),
    setup: setupSpeech },
  transcribe: { fits: (m) => only(inputs(m), "audio") && has(m.modalities, "text"),
    setup: setupTranscribe },
  images: { fits: (m) => has(m.modalities, "image"), setup: setupImages },
  video: { fits: (m) => has(m.modalities, "video"), setup: setupVideo },
};

// for the end-to-end tests: what the page has done, read from outside
window.omniUi = { stats, ready: false };

function selectTab(name, focus = false) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const selected = tab.dataset.tab === name;
    tab.setAttribute("aria-selected", String(selected));
    tab.tabIndex = selected ? 0 : -1;
    $(tab.getAttribute("aria-controls")).hidden = !selected;
    if (selected && focus) tab.focus();
  }
  history.replaceState(null, "", `#${name}`);
}

// WAI-ARIA tabs: arrow keys move between tabs, Tab moves into the panel.
function keyboardTabs(visible) {
  $("tabs").addEventListener("keydown", (e) => {
    const at = visible.indexOf(document.activeElement.dataset.tab);
    const moves = { ArrowRight: 1, ArrowLeft: -1, Home: -at, End: visible.length - 1 - at };
    if (at < 0 || !(e.key in moves)) return;
    e.preventDefault();
    selectTab(visible[(at + moves[e.key] + visible.length) % visible.length], true);
  });
}

function describe(models) {
  const names = models.map((m) => `${m.id} (${(m.modalities || []).join("+")})`);
  $("served").textContent = models.length ? `Serving ${names.join(", ")}` : "Serving no models";
}

function showTabs(models) {
  const visible = [];
  for (const [name, tab] of Object.entries(TABS)) {
    const fitting = models.filter(tab.fits);
    if (tab.order) fitting.sort((a, b) => tab.order(a) - tab.order(b));
    $(`tab-${name}`).hidden = !fitting.length;
    if (!fitting.length) continue;
    visible.push(name);
    tab.setup(fitting, fitting[0].id);
    $(`tab-${name}`).addEventListener("click", () => selectTab(name));
  }
  $("tabs").hidden = false;
  keyboardTabs(visible);
  const wanted = location.hash.slice(1);
  selectTab(visible.includes(wanted) ? wanted : visible[0]);
}

async function askForKey() {
  const form = $("key-form");
  form.hidden = false;
  $("key-input").focus();
  window.omniUi.ready = true;  // booted: waiting for the person now
  return new Promise((resolve) => {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      setApiKey($("key-input").value.trim());
      try {
        const models = await getJson("/v1/models");
        form.hidden = true;
        resolve(models);
      } catch (err) {
        setApiKey("");
        showError($("key-error"), err);
      }
    });
  });
}

async function loadModels() {
  try {
    return await getJson("/v1/models");
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      setApiKey("");
      return askForKey();
    }
    throw err;
  }
}

async function boot() {
  startStatus();
  try {
    const models = (await loadModels()).data;
    describe(models);
    showTabs(models);
  } catch (err) {
    $("served").textContent = "";
    showError($("load-error"), err);
  }
  window.omniUi.ready = true;
}

boot();
