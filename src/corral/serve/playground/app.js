// corral playground: an editor, a run button, the transcript and live output.
// Plain browser JavaScript, no build step, no third-party code; talks to corral serve's
// POST /v1/snippets (NDJSON stream: "log" events as they come, then the "transcript").
// Everything shown is set through textContent: snippet output is never parsed as HTML.
"use strict";

const EXAMPLE = [
  "import math",
  "",
  "def area(r):",
  "    return math.pi * r * r",
  "",
  "radii = [1, 2, 3]",
  "areas = [round(area(r), 2) for r in radii]",
  "print('areas:', areas)",
  "sum(areas)",
  "",
].join("\n");
const INDENT = "    ";
const $ = (id) => document.getElementById(id);

let controller = null;
let shownLogs = 0;

function setState(state, text, cls) {
  document.body.dataset.state = state;
  const status = $("status");
  status.textContent = text;
  status.className = cls || "muted";
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

function appendLog(line) {
  const out = $("output");
  const stream = line.stream || "stdout";
  const span = el("span", stream === "stdout" ? "" : stream, line.text + "\n");
  span.dataset.stream = stream;
  out.appendChild(span);
  out.scrollTop = out.scrollHeight;
  shownLogs += 1;
}

function errorNode(e) {
  const box = el("div", "error");
  box.dataset.type = e.type || "";
  if (e.code) box.dataset.code = e.code;
  const head = el("div");
  head.appendChild(el("span", "kind", e.type || "error"));
  if (e.code) head.appendChild(el("span", "muted", " [" + e.code + "]"));
  head.appendChild(document.createTextNode(": " + (e.message || "")));
  if (e.line) {
    const where = (e.path ? e.path + ":" : "line ") + e.line + (e.column != null ? ":" + e.column : "");
    head.appendChild(el("span", "muted", "  (" + where + ")"));
  }
  box.appendChild(head);
  if (e.traceback) box.appendChild(el("pre", "", e.traceback));
  return box;
}

function showTranscript(t) {
  (t.logs || []).slice(shownLogs).forEach(appendLog);
  $("result").textContent = t.result == null ? "" : t.result;
  const facts = t.facts || {};
  $("facts").textContent = Object.keys(facts).length ? JSON.stringify(facts, null, 2) : "";
  const errors = $("errors");
  errors.replaceChildren(...(t.errors || []).map(errorNode));
  const meta = [];
  if (t.level) meta.push("ran at level " + t.level, t.duration_ms + " ms");
  else meta.push("not run");
  if (t.timed_out) meta.push("timed out");
  if (t.truncated && t.truncated.length) meta.push("truncated: " + t.truncated.join(", "));
  $("meta").textContent = meta.join(" · ");
  const rejected = (t.errors || []).some((e) => e.type === "ValidationError");
  if (rejected) setState("done", "rejected by the validator (not run)", "bad");
  else if (t.timed_out) setState("done", "timed out", "bad");
  else if ((t.errors || []).length) setState("done", "raised " + t.errors[0].type, "bad");
  else setState("done", "ok", "ok");
}

function showApiError(status, doc) {
  const err = (doc && doc.error) || { code: "http-" + status, message: "HTTP " + status };
  $("errors").replaceChildren(errorNode({ type: "HTTP " + status, code: err.code, message: err.message }));
  setState("error", "error: " + err.code, "bad");
}

async function readNdjson(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let transcript = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buffer += decoder.decode(value, { stream: !done });
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl).trim();
      buffer = buffer.slice(nl + 1);
      if (!line) continue;
      const ev = JSON.parse(line);
      if (ev.event === "log") appendLog(ev);
      else if (ev.event === "transcript") transcript = ev.transcript;
      else if (ev.event === "error") return showApiError(500, ev);
    }
    if (done) break;
  }
  if (transcript) showTranscript(transcript);
  else setState("error", "the stream ended without a transcript", "bad");
}

async function run() {
  if (controller) return;
  const token = $("token").value.trim();
  sessionStorage.setItem("corral.token", token);
  sessionStorage.setItem("corral.source", $("editor").value);
  $("output").replaceChildren();
  $("result").textContent = "";
  $("facts").textContent = "";
  $("errors").replaceChildren();
  $("meta").textContent = "";
  shownLogs = 0;
  const body = { source: $("editor").value, stream: true };
  const timeout = parseInt($("timeout").value, 10);
  if (!Number.isNaN(timeout)) body.timeout_ms = timeout;
  if ($("level").value) body.level = $("level").value;
  controller = new AbortController();
  $("run").disabled = true;
  $("stop").disabled = false;
  setState("running", "running…");
  try {
    const resp = await fetch("/v1/snippets", {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/x-ndjson",
                 authorization: "Bearer " + token },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!resp.ok) {
      let doc = null;
      try { doc = await resp.json(); } catch (_) { /* not JSON */ }
      showApiError(resp.status, doc);
    } else if ((resp.headers.get("content-type") || "").includes("ndjson")) {
      await readNdjson(resp);
    } else {
      showTranscript(await resp.json());
    }
  } catch (err) {
    if (err.name === "AbortError") setState("error", "stopped (the server cancels the run)", "bad");
    else setState("error", "request failed: " + err.message, "bad");
  } finally {
    controller = null;
    $("run").disabled = false;
    $("stop").disabled = true;
  }
}

// -- the editor: a textarea with indentation keys -----------------------------------
function replaceSelection(ta, text, selStart, selEnd) {
  ta.setRangeText(text, ta.selectionStart, ta.selectionEnd, "end");
  if (selStart !== undefined) ta.setSelectionRange(selStart, selEnd);
  ta.dispatchEvent(new Event("input", { bubbles: true }));
}

function lineBounds(ta) {
  const v = ta.value;
  const start = v.lastIndexOf("\n", ta.selectionStart - 1) + 1;
  let end = v.indexOf("\n", Math.max(ta.selectionEnd - (ta.selectionEnd > ta.selectionStart ? 1 : 0), ta.selectionStart));
  if (end < 0) end = v.length;
  return [start, end];
}

function indentLines(ta, outdent) {
  const [start, end] = lineBounds(ta);
  const lines = ta.value.slice(start, end).split("\n");
  const changed = lines.map((l) => {
    if (!outdent) return INDENT + l;
    const m = l.match(/^( {1,4}|\t)/);
    return m ? l.slice(m[0].length) : l;
  });
  ta.setSelectionRange(start, end);
  const text = changed.join("\n");
  replaceSelection(ta, text, start, start + text.length);
}

function onKey(ev) {
  const ta = ev.target;
  if ((ev.ctrlKey || ev.metaKey) && ev.key === "Enter") {
    ev.preventDefault();
    run();
  } else if (ev.key === "Tab") {
    ev.preventDefault();
    const multi = ta.value.slice(ta.selectionStart, ta.selectionEnd).includes("\n");
    if (ev.shiftKey || multi) indentLines(ta, ev.shiftKey);
    else replaceSelection(ta, INDENT);
  } else if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    const before = ta.value.slice(0, ta.selectionStart);
    const line = before.slice(before.lastIndexOf("\n") + 1);
    let indent = line.match(/^[ \t]*/)[0];
    if (/:\s*(#.*)?$/.test(line)) indent += INDENT;
    replaceSelection(ta, "\n" + indent);
  } else if (ev.key === "Escape") {
    ta.blur(); // Tab moves focus again
  }
}

// The levels this server offers and whose token this is (GET /v1/info), when a token
// is set; a level it does not offer is disabled in the list.
async function loadInfo() {
  const token = $("token").value.trim();
  $("who").textContent = "";
  if (!token) return;
  try {
    const resp = await fetch("/v1/info", { headers: { authorization: "Bearer " + token } });
    if (!resp.ok) { $("who").textContent = "token refused"; $("who").className = "bad"; return; }
    const info = await resp.json();
    $("who").textContent = "tenant " + info.tenant;
    $("who").className = "muted";
    for (const opt of $("level").options) {
      if (opt.value) opt.disabled = !(info.levels || []).includes(opt.value);
    }
  } catch (_) { /* the page still works: runs report their own errors */ }
}

// base64url (RFC 4648 §5) of UTF-8 text, as corral mcp's playground_url carries it
function fromBase64Url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  const bytes = Uint8Array.from(atob(b64 + "===".slice((b64.length + 3) % 4)), (c) => c.charCodeAt(0));
  return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
}

function init() {
  // #token=... and #source=<base64url>: read once, then taken out of the address bar
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) sessionStorage.setItem("corral.token", hash.get("token"));
  if (hash.get("source")) {
    try { sessionStorage.setItem("corral.source", fromBase64Url(hash.get("source"))); }
    catch (_) { /* a mangled link: keep what the tab had */ }
  }
  if (location.hash) history.replaceState(null, "", location.pathname + location.search);
  $("token").value = sessionStorage.getItem("corral.token") || "";
  $("editor").value = sessionStorage.getItem("corral.source") || EXAMPLE;
  $("editor").addEventListener("keydown", onKey);
  $("run").addEventListener("click", run);
  $("stop").addEventListener("click", () => controller && controller.abort());
  $("token").addEventListener("change", loadInfo);
  setState("ready", "ready");
  loadInfo();
}

document.addEventListener("DOMContentLoaded", init);
