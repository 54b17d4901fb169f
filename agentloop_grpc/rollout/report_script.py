"""The style and the vanilla-JS script of report.html (no library, no network): the page reads its data from the
embedded JSON, and its state (filters, an error cause, the selected trajectory, the timeline scale) from the URL
hash, so a link, a reload or a test driving a headless browser lands on the same view."""

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(210px, 1fr)); gap: 6px; margin: 1em 0; }
.facts div { border: 1px solid #ddd; padding: 6px 10px; border-radius: 4px; }
.facts b { display: block; font-size: 20px; }
.filters { display: flex; flex-wrap: wrap; gap: 12px; align-items: center; margin: 8px 0; }
.filters input[type=number] { width: 5em; }
.scroll { max-height: 420px; overflow: auto; border: 1px solid #ddd; }
#rows tr { cursor: pointer; }
#rows tr.selected { background: #fff3bf; }
#rows tr.failed td.termination { color: #b00; font-weight: bold; }
.tokens { font-family: monospace; white-space: pre-wrap; border: 1px solid #ccc; padding: 1em; line-height: 1.6;
          max-height: 520px; overflow: auto; }
.prompt { color: #888; }
.model { background: #cfe2f3; border-right: 1px solid #9fc5e8; }
.context { background: #fce5cd; border-right: 1px solid #f9cb9c; }
.messages pre { white-space: pre-wrap; margin: 2px 0 8px 0; background: #fafafa; padding: 4px; }
.messages img.picture { max-width: 256px; image-rendering: pixelated; border: 1px solid #ccc; }
.error { color: #b00; white-space: pre-wrap; }
pre { white-space: pre-wrap; margin: 4px 0; }
.note { color: #555; font-size: 13px; }
.tl-row { display: flex; align-items: center; height: 16px; margin: 1px 0; }
.tl-label { width: 170px; flex: none; font: 11px monospace; overflow: hidden; text-overflow: ellipsis;
            white-space: nowrap; cursor: pointer; }
.tl-track { position: relative; flex: 1; height: 14px; }
.tl-bar, .tl-phase { position: absolute; top: 0; height: 14px; }
.tl-bar { background: #dddddd; }
.tl-phase { min-width: 3px; }
.generating { background: #1f77b4; }
.tools { background: #2ca02c; }
.interaction { background: #9467bd; }
.waiting { background: #dddddd; }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: middle; margin: 0 3px 0 10px; }
.tl-axis { display: flex; justify-content: space-between; margin-left: 170px; font-size: 11px; color: #555; }
"""

SCRIPT = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("report-data").textContent);
const ROWS = DATA.rows;
const MAX_TABLE_ROWS = 1000, MAX_TIMELINE_ROWS = 300;
const $ = (id) => document.getElementById(id);
const CONTROLS = {rmin: "f-reward-min", rmax: "f-reward-max", termination: "f-termination", error: "f-error",
                  group: "f-group", q: "f-id", scale: "t-scale"};

function readHash() {
  const state = {};
  for (const [key, value] of new URLSearchParams(location.hash.slice(1))) state[key] = value;
  return state;
}

function writeHash(state) {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== "" && value !== undefined) params.set(key, value);
  history.replaceState(null, "", "#" + params.toString());
}

function stateFromControls() {
  const state = {};
  for (const [key, id] of Object.entries(CONTROLS)) state[key] = $(id).value;
  const hash = readHash();  // the keys no control shows: the selected trajectory, an error cause
  state.select = hash.select || "";
  state.cause = hash.cause || "";
  return state;
}

function matches(row, s) {
  if (s.rmin !== "" && s.rmin !== undefined && !(row.reward >= Number(s.rmin))) return false;
  if (s.rmax !== "" && s.rmax !== undefined && !(row.reward <= Number(s.rmax))) return false;
  if (s.termination && row.termination !== s.termination) return false;
  if (s.error === "ok" && row.failed) return false;
  if (s.error === "failed" && !row.failed) return false;
  if (s.error === "infrastructure" && !row.infra) return false;
  if (s.error === "model" && !(row.failed && !row.infra)) return false;
  if (s.cause && row.error !== s.cause) return false;
  if (s.group && row.group !== s.group) return false;
  if (s.q && !row.id.includes(s.q)) return false;
  return true;
}

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
}

function renderTable(shown, s) {
  const body = $("rows");
  body.textContent = "";
  for (const row of shown.slice(0, MAX_TABLE_ROWS)) {
    const tr = document.createElement("tr");
    tr.dataset.id = row.id;
    if (row.failed) tr.classList.add("failed");
    if (row.id === s.select) tr.classList.add("selected");
    cell(tr, row.id); cell(tr, row.group); cell(tr, row.reward); cell(tr, row.termination, "termination");
    cell(tr, row.turns); cell(tr, row.tool_calls + (row.tool_errors ? " (" + row.tool_errors + " failed)" : ""));
    cell(tr, row.model_tokens + " / " + row.tokens); cell(tr, row.total_s.toFixed(2)); cell(tr, row.drift);
    cell(tr, row.failed ? (row.infra ? "[infrastructure] " : "") + row.error : "", "error");
    tr.addEventListener("click", () => select(row.id));
    body.appendChild(tr);
  }
  $("match-count").textContent = shown.length + " of " + ROWS.length + " trajectories match" +
    (s.cause ? " the error cause \u201c" + s.cause + "\u201d" : "") +
    (shown.length > MAX_TABLE_ROWS ? "; the table lists the first " + MAX_TABLE_ROWS : "");
  if (s.cause) {
    const clear = document.createElement("a");
    clear.href = "#"; clear.textContent = " (any cause)";
    clear.addEventListener("click", (event) => {
      event.preventDefault();
      writeHash({...stateFromControls(), cause: ""});
      render();
    });
    $("match-count").appendChild(clear);
  }
}

function span(cls, text, title) {
  const el = document.createElement("span");
  el.className = cls;
  el.textContent = text;
  if (title) el.title = title;
  return el;
}

function renderSelected(id) {
  const row = ROWS.find((r) => r.id === id);
  const detail = DATA.details[id];
  $("selected").hidden = !row;
  if (!row) return;
  $("sel-title").textContent = row.id + (row.group ? " (group " + row.group + ")" : "");
  $("sel-facts").textContent = "reward " + row.reward + ", termination " + row.termination + ", " + row.turns +
    " assistant turns, " + row.tool_calls + " tool calls (" + row.tool_errors + " failed, " + row.malformed +
    " malformed), loop " + row.loop + (row.drift ? ", " + row.drift + " drift" : "");
  $("sel-error").textContent = row.failed ? (row.infra ? "infrastructure failure (not the model's doing): "
    : "failed (the sample or the model): ") + (detail ? detail.error : row.error) : "";
  const tokens = $("tokens"), messages = $("messages");
  tokens.textContent = ""; messages.textContent = "";
  if (!detail) {
    $("sel-counts").textContent = "No token view embedded for this trajectory (the page's size cap); " +
      "trajectories.parquet has it.";
    return;
  }
  let model = 0, i = 0;
  const frag = document.createDocumentFragment();
  const prompt = DATA.prompts[detail.prompt];
  if (prompt) frag.appendChild(span("prompt", prompt));
  // the mask comes as runs: [first value, length, length, ...], the values alternating
  detail.mask.slice(1).forEach((length, run) => {
    const masked = (detail.mask[0] + run) % 2 === 1;
    for (const token of detail.ids.slice(i, i + length)) {
      const text = DATA.tokens[token];
      if (masked) {
        frag.appendChild(span("model", text, "id " + token + ", logprob " + detail.logprobs[model].toFixed(3)));
        model += 1;
      } else {
        frag.appendChild(span("context", text, "id " + token));
      }
    }
    i += length;
  });
  tokens.appendChild(frag);
  const counted = (id, n) => { const el = span("", String(n)); el.id = id; return el; };
  $("sel-counts").textContent = "";
  $("sel-counts").append("Response: ", counted("count-model", model), " model tokens (mask 1), ",
    counted("count-context", detail.ids.length - model), " tool / template tokens (mask 0).");
  for (const m of detail.messages) {
    const head = document.createElement("b");
    head.textContent = m.role + (m.name ? " (" + m.name + ")" : "");
    const body = document.createElement("pre");
    body.textContent = (m.content || "") + (m.tool_calls ? "\ntool calls: " + JSON.stringify(m.tool_calls) : "");
    messages.append(head, body);
  }
  (detail.images || []).forEach((url, i) => {
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.textContent = "image " + i + (url ? "" : " (too large to embed)");
    if (url) {
      const img = document.createElement("img");
      img.src = url;
      img.className = "picture";
      figure.append(img);
    }
    figure.append(caption);
    messages.append(figure);
  });
}

function renderTimeline(shown, s) {
  const box = $("timeline");
  box.textContent = "";
  const byId = new Map(DATA.timeline.rows.map((r) => [r.id, r]));
  const rows = shown.slice(0, MAX_TIMELINE_ROWS).map((r) => byId.get(r.id));
  const fitted = s.scale === "fitted";
  const span_s = fitted ? 0 : Math.max(1e-9, ...rows.map((r) => r.start + r.total));
  for (const r of rows) {
    const line = document.createElement("div");
    line.className = "tl-row";
    line.dataset.id = r.id;
    const label = document.createElement("div");
    label.className = "tl-label";
    label.textContent = r.id;
    label.title = r.id + ": " + r.total.toFixed(3) + " s";
    label.addEventListener("click", () => select(r.id));
    const track = document.createElement("div");
    track.className = "tl-track";
    const width = fitted ? Math.max(r.total, 1e-9) : span_s;
    const offset = fitted ? 0 : r.start;
    const pct = (x) => (100 * x / width) + "%";
    const bar = document.createElement("div");
    bar.className = "tl-bar waiting";
    bar.style.left = pct(offset); bar.style.width = pct(r.total);
    bar.title = r.id + ": " + r.total.toFixed(3) + " s in all (grey: waiting)";
    track.appendChild(bar);
    for (const [phase, start, seconds, turn, tokens, server] of r.phases) {
      const el = document.createElement("div");
      el.className = "tl-phase " + phase;
      el.style.left = pct(offset + start); el.style.width = pct(seconds);
      el.title = phase + ", turn " + turn + ": " + (seconds * 1000).toFixed(1) + " ms, " + tokens + " tokens" +
        (server ? ", " + server : "");
      track.appendChild(el);
    }
    line.append(label, track);
    box.appendChild(line);
  }
  const axis = $("tl-axis");
  axis.textContent = "";
  const end = fitted ? "each row: its own trajectory's length" : span_s.toFixed(3) + " s";
  axis.append(span("", fitted ? "trajectory start" : "0 s (first start)"), span("", end));
  $("tl-note").textContent = (rows.length < shown.length ? "The first " + rows.length + " of " + shown.length +
    " matching trajectories. " : rows.length + " trajectories (the table's filters apply). ") +
    (DATA.timeline.traced ? "" : "No trace.jsonl (trace: false): only whole trajectories are drawn.");
}

function render() {
  const s = readHash();
  for (const [key, id] of Object.entries(CONTROLS)) $(id).value = s[key] || (key === "scale" ? "shared" : "");
  const shown = ROWS.filter((row) => matches(row, s));
  if (!s.select && shown.length) s.select = (shown.find((r) => DATA.details[r.id]) || shown[0]).id;
  renderTable(shown, s);
  renderSelected(s.select);
  renderTimeline(shown, s);
}

function select(id) {
  writeHash({...stateFromControls(), select: id});
  render();
}

for (const id of Object.values(CONTROLS)) {
  $(id).addEventListener("input", () => { writeHash(stateFromControls()); render(); });
}
window.addEventListener("hashchange", render);
render();
"""
