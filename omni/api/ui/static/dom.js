// Small DOM helpers shared by the tabs (no framework: the page has a dozen controls a tab).

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key in node) node[key] = value;
    else node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// Options of a <select>: models that fit the tab, the preferred one selected.
export function fillSelect(select, values, preferred) {
  const keep = select.value;
  select.replaceChildren(...values.map((v) => el("option", { value: v, textContent: v })));
  if (values.includes(keep)) select.value = keep;
  else if (preferred && values.includes(preferred)) select.value = preferred;
}

// A tab's error line: the API's message, announced by screen readers (role=alert).
export function showError(node, err) {
  node.textContent = err ? (err.message || String(err)) : "";
  node.hidden = !err;
}

// A button that runs an async action once at a time, with the tab's error line.
export function action(button, errorNode, run) {
  button.addEventListener("click", async (event) => {
    event.preventDefault();
    if (button.disabled) return;
    showError(errorNode, null);
    button.disabled = true;
    try {
      await run();
    } catch (err) {
      if (err.name !== "AbortError") showError(errorNode, err);
    } finally {
      button.disabled = false;
    }
  });
}

export function downloadName(prefix, format) {
  return `${prefix}-${new Date().toISOString().replace(/[:.]/g, "-")}.${format}`;
}
