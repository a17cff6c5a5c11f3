// corral notebook: cells run in a session of corral serve, outputs shown as a notebook
// shows them. Plain browser JavaScript, no build step, no third-party code.
// Nothing from the sandbox is ever inserted as markup: text through textContent, PNGs as
// data: URLs of checked base64, and an HTML table (text/html) parsed by DOMParser into an
// inert document and rebuilt cell by cell from its text (no attribute, no other element).
"use strict";

const $ = (id) => document.getElementById(id);
let session = null;
let running = 0;

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setStatus(state, text) {
  document.body.dataset.state = state;
  $("status").textContent = text;
}

function headers(json) {
  const h = { "authorization": "Bearer " + $("token").value.trim() };
  if (json) h["content-type"] = "application/json";
  return h;
}

async function startSession() {
  setStatus("starting", "starting a session...");
  // the packages come from a built environment the operator lists for the tenant
  const environment = $("environment").value.trim();
  const body = JSON.stringify(environment ? { environment } : {});
  const r = await fetch("/v1/sessions", { method: "POST", headers: headers(true), body });
  const doc = await r.json();
  if (r.status !== 201) {
    setStatus("error", "session refused: " + ((doc.error || {}).message || r.status));
    return;
  }
  session = doc.id;
  $("session").textContent = "session " + session + " (Python " + doc.python + ")";
  setStatus("ready", "ready");
}

async function upload(file) {
  if (!session || !file) return;
  const url = "/v1/sessions/" + session + "/files?path=" + encodeURIComponent(file.name);
  const r = await fetch(url, { method: "PUT", headers: headers(false), body: file });
  setStatus(r.status === 204 ? "ready" : "error",
            r.status === 204 ? "uploaded " + file.name : "upload failed: " + r.status);
}

const B64 = /^[A-Za-z0-9+/]*={0,2}$/;

function table(html) {
  // an inert document: no script runs, nothing is fetched
  const doc = new DOMParser().parseFromString(html, "text/html");
  const src = doc.querySelector("table");
  if (!src) return null;
  const out = el("table");
  for (const row of src.querySelectorAll("tr")) {
    const tr = el("tr");
    for (const c of row.children) {
      if (c.tagName !== "TH" && c.tagName !== "TD") continue;
      tr.appendChild(el(c.tagName.toLowerCase(), "", c.textContent));
    }
    out.appendChild(tr);
  }
  return out;
}

function bundle(data) {
  const png = data["image/png"];
  if (typeof png === "string" && B64.test(png)) {
    const img = el("img");
    img.alt = data["text/plain"] || "image";
    img.src = "data:image/png;base64," + png;
    return img;
  }
  if (typeof data["text/html"] === "string") {
    const t = table(data["text/html"]);
    if (t) return t;
  }
  return el("pre", "plain", String(data["text/plain"] || ""));
}

function addCell(code) {
  const cell = el("section", "cell");
  const prompt = el("div", "prompt", "[ ]:");
  const editor = el("textarea");
  editor.spellcheck = false;
  editor.value = code || "";
  const run = el("button", "run", "Run");
  run.type = "button";
  const outputs = el("div", "outputs");
  cell.append(prompt, editor, run, outputs);
  run.addEventListener("click", () => runCell(cell, editor, prompt, outputs));
  editor.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.shiftKey)) {
      ev.preventDefault();
      runCell(cell, editor, prompt, outputs);
    }
  });
  $("cells").appendChild(cell);
  return cell;
}

function show(outputs, ev) {
  if (ev.event === "stdout" || ev.event === "stderr") {
    const last = outputs.lastChild;
    if (last && last.dataset.stream === ev.event) {
      last.textContent += ev.text;
    } else {
      const pre = el("pre", ev.event, ev.text);
      pre.dataset.stream = ev.event;
      outputs.appendChild(pre);
    }
  } else if (ev.event === "display" || ev.event === "result") {
    const node = bundle(ev.data || {});
    node.dataset.kind = ev.event;
    outputs.appendChild(node);
  } else if (ev.event === "cell") {
    const c = ev.cell;
    if (c.error) outputs.appendChild(el("pre", "traceback", c.error.traceback || (c.error.name + ": " + c.error.value)));
    for (const note of c.notes || []) outputs.appendChild(el("pre", "stderr", "[" + note + "]"));
    return c;
  } else if (ev.event === "error") {
    outputs.appendChild(el("pre", "traceback", "session ended: " + ((ev.error || {}).message || "")));
  }
  return null;
}

async function runCell(cell, editor, prompt, outputs) {
  if (!session) await startSession();
  if (!session) return;
  outputs.replaceChildren();
  prompt.textContent = "[*]:";
  running += 1;
  setStatus("running", "running...");
  let ended = null;
  try {
    const r = await fetch("/v1/sessions/" + session + "/cells", {
      method: "POST", headers: headers(true),
      body: JSON.stringify({ code: editor.value, stream: true }),
    });
    if (r.status !== 200) {
      const doc = await r.json();
      outputs.appendChild(el("pre", "traceback", (doc.error || {}).message || String(r.status)));
    } else {
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let nl;
        while ((nl = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, nl);
          buf = buf.slice(nl + 1);
          if (line) ended = show(outputs, JSON.parse(line)) || ended;
        }
      }
    }
  } catch (e) {
    outputs.appendChild(el("pre", "traceback", String(e)));
  }
  prompt.textContent = ended ? "[" + ended.cell + "]:" : "[!]:";
  cell.dataset.done = ended ? (ended.ok ? "ok" : "error") : "failed";
  running -= 1;
  if (!running) setStatus("done", "done");
  if (cell === $("cells").lastChild) addCell("");
}

function init() {
  const m = /(?:^#|&)token=([^&]*)/.exec(location.hash);
  if (m) {
    $("token").value = decodeURIComponent(m[1]);
    history.replaceState(null, "", location.pathname + location.search);
  }
  $("start").addEventListener("click", startSession);
  $("add").addEventListener("click", () => addCell(""));
  $("upload").addEventListener("change", (ev) => upload(ev.target.files[0]));
  addCell("");
  setStatus("ready", "ready");
}

document.addEventListener("DOMContentLoaded", init);
