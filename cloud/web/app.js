"use strict";
// FilterForward operator page: plain JS against the cloud's REST API (no build step, no dependencies).
// Every API call carries the bearer token from localStorage; images and clips are fetched the same way and
// shown through blob URLs, because <img> and <video> cannot send an Authorization header.

const TOKEN_KEY = "filterforward.token";
const POLL_MS = 2000;
const PAGE_SIZE = 50;
const MAX_CATCH_UP_PAGES = 5; // pages one poll follows when more than a page of events arrived since the last

const byId = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

// ---------------------------------------------------------------------------------------------------- API

function storedToken() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

/** Same-origin path of a URL the server returned (its public_url may name a host this page cannot reach). */
function localPath(url) {
  const parsed = new URL(url, location.href);
  return parsed.pathname + parsed.search;
}

// An answer to a request sent with a token the page no longer holds (Forget, or another token given meanwhile): never
// shown, so the previous session's data cannot come back after the views were cleared.
const TOKEN_CHANGED = -1;

/** One API call with the bearer token; `json` is sent as a JSON body, `body` as it is (e.g. FormData). */
async function api(path, { method = "GET", body, json, as = "json" } = {}) {
  const token = storedToken();
  const headers = { Authorization: `Bearer ${token}` };
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(json);
  }
  let response;
  try {
    response = await fetch(localPath(path), { method, body, headers });
  } catch (err) {
    setConnection("down");
    throw new ApiError(0, `cannot reach the server (${err.message}); check that filterforward cloud serve is running`);
  }
  if (storedToken() !== token) throw new ApiError(TOKEN_CHANGED, "the token changed meanwhile");
  setConnection(response.status === 401 ? "refused" : "live"); // 403: a token without the scope, still signed in
  if (!response.ok) throw new ApiError(response.status, await errorDetail(response));
  if (as === "blob") return response.blob();
  return response.status === 204 ? null : response.json();
}

/** The server's one-line `detail`, or a readable stand-in when the body is not the usual JSON error. */
async function errorDetail(response) {
  const fallback = `HTTP ${response.status} ${response.statusText}`.trim();
  let body;
  try {
    body = await response.json();
  } catch {
    return fallback;
  }
  const detail = body && body.detail;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) return detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  return fallback;
}

const isAuthError = (err) => err instanceof ApiError && (err.status === 401 || err.status === 403);

// ------------------------------------------------------------------------------------------- formatting

/** Server times are UTC; a timestamp without an offset (as SQLite may return it) is read as UTC too. */
function parseTime(iso) {
  if (!iso) return NaN;
  return Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(iso) ? iso : `${iso}Z`);
}

const fmt = {
  number: (value, digits = 1) => (typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–"),
  count: (value) => (typeof value === "number" && Number.isFinite(value) ? Math.round(value).toLocaleString() : "–"),
  bytes(value) {
    if (typeof value !== "number" || !Number.isFinite(value)) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let size = value;
    let unit = 0;
    while (size >= 1024 && unit < units.length - 1) {
      size /= 1024;
      unit += 1;
    }
    return `${size.toFixed(unit === 0 ? 0 : 1)} ${units[unit]}`;
  },
  time(iso) {
    const ms = parseTime(iso);
    return Number.isFinite(ms) ? new Date(ms).toLocaleString() : "–";
  },
  age(iso) {
    const ms = parseTime(iso);
    if (!Number.isFinite(ms)) return "never";
    const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (seconds < 60) return `${seconds} s ago`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return new Date(ms).toLocaleString();
  },
  seconds: (value) => (typeof value === "number" ? `${value.toFixed(1)} s` : "…"),
};

// ---------------------------------------------------------------------------------------------- DOM helpers

/** An element with attributes and children; strings become text nodes, so server data is never parsed as HTML. */
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  node.append(...children.filter((child) => child !== null && child !== undefined));
  return node;
}

function setStatus(id, text, isError = false) {
  const node = byId(id);
  node.textContent = text;
  node.classList.toggle("error", isError);
  node.classList.toggle("ok", !isError && text !== "");
}

/** A form's answer: what was done, or (isError) the server's refusal, announced to screen readers. */
function setMessage(id, text, isError = false) {
  const node = byId(id);
  node.textContent = text;
  node.classList.toggle("error", isError);
  node.classList.toggle("ok", !isError && text !== "");
  node.setAttribute("role", isError ? "alert" : "status");
}

const CONNECTION = {
  live: "Connected",
  down: "Server unreachable",
  refused: "Token refused",
  signedOut: "Not signed in",
};

/** The indicator at the top: one of CONNECTION's states. */
function setConnection(state) {
  const node = byId("connection");
  node.textContent = CONNECTION[state];
  node.classList.toggle("live", state === "live");
  node.classList.toggle("down", state !== "live");
}

function showAuthError(text) {
  const banner = byId("auth-error");
  banner.textContent = text || "";
  banner.hidden = !text;
}

function emptyRow(columns, text) {
  return el("tr", {}, el("td", { colspan: columns, class: "empty" }, text));
}

function onlineDot(online) {
  return el("span", { class: online ? "dot online" : "dot", role: "img", "aria-label": online ? "online" : "offline" });
}

function numCell(field, text) {
  return el("td", { class: "num", "data-field": field }, text);
}

/** A <select>'s options from [value, text] pairs (`none` when there are none), keeping the chosen one if offered. */
function setChoices(select, choices, none) {
  const chosen = select.value;
  const options = choices.map(([value, text]) => el("option", { value }, text));
  select.replaceChildren(...(options.length ? options : [el("option", { value: "" }, none)]));
  if (choices.some(([value]) => value === chosen)) select.value = chosen;
}

function setOptions(datalist, values) {
  const unique = [...new Set(values)].sort();
  if (unique.join("\n") === datalist.dataset.values) return; // an open suggestion list is left alone
  datalist.dataset.values = unique.join("\n");
  datalist.replaceChildren(...unique.map((value) => el("option", { value })));
}

// ------------------------------------------------------------------------------------------------- filters

let filtersSignature = ""; // the table is rebuilt only when the list changed, so focus and clicks survive polls

async function refreshFilters() {
  const filters = await api("/api/filters");
  const signature = JSON.stringify(filters);
  if (signature === filtersSignature) return;
  filtersSignature = signature;
  const rows = filters.map(filterRow);
  byId("filters-body").replaceChildren(...(rows.length ? rows : [emptyRow(10, "No filters registered yet.")]));
  setOptions(byId("filter-names"), filters.map((filter) => filter.name));
  document.dispatchEvent(new Event("filters-changed")); // the studio's revisions panel reads them again (studio.js)
}

function filterRow(filter) {
  const spec = filter.spec;
  const smoothing = spec.smoothing || {};
  const encoding = spec.encoding || {};
  const roi = spec.roi || {};
  const [width, height] = spec.input_size || [];
  const remove = el(
    "button",
    { type: "button", class: "danger", "aria-label": `Delete filter ${filter.name}`, "data-testid": "filter-delete" },
    "Delete",
  );
  remove.addEventListener("click", () => deleteFilter(filter.name, remove));
  return el(
    "tr",
    { "data-testid": "filter-row", "data-name": filter.name },
    el(
      "td",
      { "data-field": "name", title: spec.event ? `event: ${spec.event}` : null },
      el("strong", {}, filter.name),
      refusedNote(filter.refused_by || []),
    ),
    el("td", { "data-field": "architecture" }, spec.architecture),
    el(
      "td",
      { "data-field": "tap", title: `ROI (${roi.x0}, ${roi.y0}) – (${roi.x1}, ${roi.y1}), window ${spec.window}` },
      `${spec.tap} @ ${width}×${height}`,
    ),
    el("td", { "data-field": "cameras" }, (spec.cameras || []).join(", ")),
    thresholdCell(smoothing, spec.motion),
    validationCell(spec.validation, spec.warnings || []),
    el("td", { "data-field": "encoding" }, encodingText(encoding)),
    numCell("version", String(spec.version)),
    numCell("revision", String(filter.revision)),
    el("td", {}, remove),
  );
}

/** "edge-1", "edges edge-1 and edge-2", "edges a, b and c". */
function refusers(edges) {
  if (edges.length === 1) return `edge ${edges[0]}`;
  return `edges ${edges.slice(0, -1).join(", ")} and ${edges[edges.length - 1]}`;
}

/** A warning on a filter that edges it targets refuse (another base model or input size): they run what they ran
 * before, or nothing, under its name. */
function refusedNote(edges) {
  if (!edges.length) return null;
  const title = `${refusers(edges)} refuse this filter: they run another base model or input size than it was trained on`;
  return el("span", { class: "warn", "data-testid": "filter-refused", title }, ` ⚠ refused by ${refusers(edges)}`);
}

/** Threshold and k-of-n, and the motion the region needs for a frame to count (FilterSpec.motion), if any. */
function thresholdCell(smoothing, motion) {
  const text = `${smoothing.threshold} · ${smoothing.k}/${smoothing.n}`;
  if (!motion) return el("td", { "data-field": "threshold" }, text);
  const share = `${(100 * motion.min_foreground).toFixed(2)}%`;
  const title = `a frame counts only if ${share} of the region's pixels moved in its last ${motion.frames} frames`;
  return el("td", { "data-field": "threshold", title }, `${text} · moving ≥ ${share}`);
}

/** A filter's encoding (FilterSpec.encoding; an old spec without one has the default, the stream). */
function encodingText(encoding) {
  if (encoding.kind === "clip") return "MP4 clip";
  if (encoding.kind === "jpeg") return `JPEG q${encoding.jpeg_quality}`;
  return "H.264 stream";
}

/** The cross-validated estimate of a filter on footage it was not trained on (spec.validation), its warnings
 * counted in the cell and listed in the tooltip; without an estimate, the spec's warnings say why and what to label. */
function validationCell(validation, unvalidated) {
  let warnings = unvalidated;
  let title = "trained without cross-validation";
  let text = "—";
  if (validation) {
    const f1 = (value) => value.toFixed(2);
    const held = validation.method === "blocks" ? "thirds of the occurrences' frames" : "whole occurrences";
    warnings = validation.warnings || [];
    title = `${validation.folds} folds, ${held} held out`;
    text = `${f1(validation.event_f1)} (${f1(validation.f1_min)}–${f1(validation.f1_max)})`;
  }
  title = [title, ...warnings.map((w) => `⚠ ${w}`)].join("\n");
  return el(
    "td",
    { "data-field": "validation", title, class: warnings.length ? "warn" : null },
    warnings.length ? `${text} ⚠ ${warnings.length}` : text,
  );
}

async function deleteFilter(name, button) {
  if (!confirm(`Delete filter "${name}"? Edges stop running it within a second.`)) return;
  button.disabled = true;
  try {
    await api(`/api/filters/${encodeURIComponent(name)}`, { method: "DELETE" });
    setStatus("filters-status", `Deleted ${name}.`);
    await refreshFilters();
  } catch (err) {
    setStatus("filters-status", `Could not delete ${name}: ${err.message}`, true);
    button.disabled = false;
  }
}

// A bundle's spec.json (written by `filterforward train`) fills the form; what the form has no field for (a polygon
// region, its context cells, the motion veto, the cross-validated estimate and warnings, the base model) goes to the
// server as the file has it, under the form's values.
let loadedSpec = null;

async function loadSpecFile(event) {
  const input = event.currentTarget;
  const file = input.files[0];
  loadedSpec = null;
  if (!file) {
    setMessage("filter-form-message", "");
    return;
  }
  let spec;
  try {
    spec = JSON.parse(await file.text());
  } catch (err) {
    setMessage("filter-form-message", `${file.name} is not JSON (${err.message}): choose a bundle's spec.json`, true);
    return;
  }
  if (!isObject(spec) || typeof spec.architecture !== "string") {
    setMessage("filter-form-message", `${file.name} holds no filter spec: choose a bundle's spec.json`, true);
    return;
  }
  const problem = specProblem(spec);
  if (problem) {
    setMessage("filter-form-message", `${file.name} is not a valid filter spec: ${problem}`, true);
    return;
  }
  fillForm(input.form, spec);
  loadedSpec = spec;
  setMessage("filter-form-message", `Filled from ${file.name}: choose the bundle's model.onnx and register it.`);
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

const isText = (value) => typeof value === "string";
const isNumber = (value) => typeof value === "number" && Number.isFinite(value);
const listOf = (fits, length) => (value) =>
  Array.isArray(value) && value.every(fits) && (length === undefined || value.length === length);

// What fillForm reads from a spec, with the shape it needs; a file that gets one wrong is refused before the form
// changes (the server validates everything else).
const SPEC_FIELDS = [
  ["name", "a text", isText],
  ["event", "a text", isText],
  ["cameras", "a list of camera names", listOf(isText)],
  ["tap", "a text", isText],
  ["input_size", "a list of two numbers [width, height]", listOf(isNumber, 2)],
  ["window", "a number", isNumber],
  ["roi", "an object", isObject],
  ["smoothing", "an object", isObject],
  ["encoding", "an object", isObject],
];

/** The first field of `spec` fillForm cannot take, as one line naming it; "" when none. */
function specProblem(spec) {
  for (const [field, shape, fits] of SPEC_FIELDS) {
    const value = spec[field];
    if (value === undefined || value === null || fits(value)) continue;
    const given = JSON.stringify(value);
    return `"${field}" must be ${shape}, not ${given.length > 40 ? `${given.slice(0, 40)}…` : given}`;
  }
  return "";
}

function fillForm(form, spec) {
  const set = (name, value) => {
    if (value !== undefined && value !== null) form.elements[name].value = String(value);
  };
  const [width, height] = spec.input_size || [];
  const roi = spec.roi || {};
  const smoothing = spec.smoothing || {};
  const encoding = spec.encoding || {};
  set("name", spec.name);
  set("event", spec.event);
  set("cameras", (spec.cameras || ["*"]).join(", "));
  set("architecture", spec.architecture);
  set("tap", spec.tap);
  set("width", width);
  set("height", height);
  set("window", spec.window);
  for (const corner of ["x0", "y0", "x1", "y1"]) set(corner, roi[corner]);
  set("threshold", smoothing.threshold);
  set("k", smoothing.k);
  set("n", smoothing.n);
  set("encoding", encoding.kind);
  set("jpeg_quality", encoding.jpeg_quality);
}

/** `spec` with the form's values over it, one level into nested objects (roi, smoothing, encoding). */
function withEdits(spec, edits) {
  const out = { ...spec };
  for (const [key, value] of Object.entries(edits)) {
    out[key] = isObject(spec[key]) && isObject(value) ? { ...spec[key], ...value } : value;
  }
  return out;
}

/** The FilterSpec JSON (models/filterspec.py) from the form; the server validates it strictly. */
function specFromForm(form) {
  const text = (name) => form.elements[name].value.trim();
  const number = (name) => Number(text(name));
  const cameras = text("cameras")
    .split(",")
    .map((camera) => camera.trim())
    .filter(Boolean);
  return {
    name: text("name"),
    event: text("event"),
    cameras: cameras.length ? cameras : ["*"],
    architecture: text("architecture"),
    tap: text("tap"),
    roi: { x0: number("x0"), y0: number("y0"), x1: number("x1"), y1: number("y1") },
    input_size: [number("width"), number("height")],
    smoothing: { threshold: number("threshold"), k: number("k"), n: number("n") },
    window: number("window"),
    encoding: { kind: text("encoding"), jpeg_quality: number("jpeg_quality") },
  };
}

async function registerFilter(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const submit = form.querySelector("[type=submit]");
  const body = new FormData();
  const edits = specFromForm(form);
  body.append("spec", JSON.stringify(loadedSpec ? withEdits(loadedSpec, edits) : edits));
  body.append("model", form.elements.model.files[0]);
  submit.disabled = true;
  setMessage("filter-form-message", "Uploading and checking the model…");
  try {
    const created = await api("/api/filters", { method: "POST", body });
    const registered = `Registered ${created.name} (revision ${created.revision}, ${fmt.bytes(created.model_bytes)}).`;
    setMessage("filter-form-message", registered);
    form.elements.name.value = "";
    form.elements.model.value = "";
    form.elements.spec_file.value = "";
    loadedSpec = null;
    await refreshFilters();
  } catch (err) {
    setMessage("filter-form-message", `Not registered: ${err.message}`, true);
  } finally {
    submit.disabled = false;
  }
}

// ------------------------------------------------------------------------------------- edges and cameras

async function refreshEdges() {
  const [edges, cameras] = await Promise.all([api("/api/edges"), api("/api/cameras")]);
  const edgeRows = edges.map(edgeRow);
  const cameraRows = cameras.map(cameraRow);
  byId("edges-body").replaceChildren(...(edgeRows.length ? edgeRows : [emptyRow(11, "No edge has connected yet.")]));
  byId("cameras-body").replaceChildren(...(cameraRows.length ? cameraRows : [emptyRow(10, "No cameras reported.")]));
  setOptions(byId("camera-names"), cameras.map((camera) => camera.name));
}

function edgeRow(edge) {
  const stats = edge.stats || {};
  return el(
    "tr",
    { "data-testid": "edge-row", "data-edge": edge.id },
    el("th", { scope: "row" }, onlineDot(edge.online), edge.id, sharedIdNote(edge)),
    el("td", { "data-field": "last_seen", title: fmt.time(edge.last_seen) }, fmt.age(edge.last_seen)),
    el("td", { "data-field": "connected" }, uplinkText(edge.online, stats)),
    baseModelCell(edge),
    numCell("filters_version", fmt.count(edge.filters_version)),
    numCell("spool_messages", fmt.count(stats.spool_messages)),
    numCell("spool_bytes", fmt.bytes(stats.spool_bytes)),
    numCell("spool_dropped", fmt.count(stats.spool_dropped)),
    numCell("in_flight", fmt.count(stats.in_flight)),
    numCell("sent_bytes", fmt.bytes(stats.sent_bytes)),
    el("td", {}, edge.online ? null : forgetButton(edge.id)),
  );
}

/** "Forget" for an offline edge gone for good (DELETE /api/edges/{id}: the API refuses an online one). */
function forgetButton(id) {
  const attrs = { type: "button", class: "danger", "aria-label": `Forget edge ${id}`, "data-testid": "edge-forget" };
  const button = el("button", attrs, "Forget");
  button.addEventListener("click", () => forgetEdge(id, button));
  return button;
}

async function forgetEdge(id, button) {
  const question = `Forget edge "${id}"? It leaves this list with its cameras; its events stay. It comes back if it connects again.`;
  if (!confirm(question)) return;
  button.disabled = true;
  try {
    await api(`/api/edges/${encodeURIComponent(id)}`, { method: "DELETE" });
    setStatus("edges-status", `Forgot edge ${id}.`);
    await refreshEdges();
  } catch (err) {
    setStatus("edges-status", `Could not forget edge ${id}: ${err.message}`, true);
    button.disabled = false;
  }
}

/** The edge's link to the cloud as its last stats said; an offline edge's last stats are stale, so not shown. */
function uplinkText(online, stats) {
  if (!online) return "edge offline";
  if (stats.connected === undefined) return "–";
  return stats.connected ? "connected" : "cloud unreachable";
}

/** A warning when two edge processes send under this edge's id (GET /api/edges: shared_id). */
function sharedIdNote(edge) {
  if (!edge.shared_id) return null;
  const title = "two edge processes send as this edge (a copied config and key): give each box its own edge_id and key";
  return el("span", { class: "warn", "data-testid": "shared-id", title }, " ⚠ two edges use this id");
}

/** The base DNN an edge runs, and the filters targeting it that it refuses (another base model or input size). */
function baseModelCell(edge) {
  const model = edge.base_model;
  const text = model ? `${model.name} ${model.precision}` : "–";
  const refused = edge.refused_filters || [];
  if (!refused.length) return el("td", { "data-field": "base_model", title: model ? `digest ${model.digest}` : "" }, text);
  return el(
    "td",
    {
      "data-field": "base_model",
      class: "warn",
      title: `refuses ${refused.join(", ")}: trained on another base model or input size; retrain them for it`,
    },
    `${text} ⚠ refuses ${refused.length}`,
  );
}

function cameraRow(camera) {
  const stats = camera.stats || {};
  return el(
    "tr",
    { "data-testid": "camera-row", "data-camera": camera.name, "data-edge": camera.edge },
    el("th", { scope: "row" }, onlineDot(camera.online), camera.name),
    el("td", { "data-field": "edge" }, camera.edge),
    el("td", { "data-field": "last_seen", title: fmt.time(camera.last_seen) }, fmt.age(camera.last_seen)),
    numCell("fps", fmt.number(stats.fps, 1)),
    numCell("base_ms", fmt.number(stats.base_ms, 1)),
    numCell("mc_ms", fmt.number(stats.mc_ms, 2)),
    numCell("frames", fmt.count(stats.frames)),
    numCell("matched", fmt.count(stats.matched)),
    numCell("dropped", fmt.count(stats.dropped)),
    numCell("bytes_out", fmt.bytes(stats.bytes_out)),
  );
}

const OVERVIEW = [
  ["filters", "filters", fmt.count],
  ["edges_online", "edges online", fmt.count],
  ["cameras", "cameras", fmt.count],
  ["events", "events", fmt.count],
  ["frames", "stored frames", fmt.count],
  ["stored_bytes", "stored", fmt.bytes],
];

async function refreshOverview() {
  const stats = await api("/api/stats");
  byId("stats-strip").replaceChildren(
    ...OVERVIEW.map(([key, label, format]) =>
      el("div", { "data-field": key }, el("dt", {}, label), el("dd", {}, format(stats[key]))),
    ),
  );
}

// ------------------------------------------------------------------------------------------- event gallery

const gallery = {
  entries: new Map(), // event id -> { card, event, fields, badge, thumbBox, thumb: "none"|"loading"|"done"|"failed", blobUrl }
  query: "", // camera/filter query string of the events shown
  generation: 0, // bumped on every reset, so answers that belong to an older query are dropped
  loaded: false,
  olderCursor: null,
};

const CARD_FIELDS = [
  ["camera", "Camera", (e) => e.camera],
  ["edge", "Edge", (e) => e.edge],
  ["started", "Started", (e) => fmt.time(e.started_at)],
  ["ended", "Ended", (e) => (e.ended_at ? fmt.time(e.ended_at) : "—")],
  ["stream", "Stream", (e) => `${fmt.seconds(e.start_time)} – ${fmt.seconds(e.end_time)}`],
  ["peak", "Peak score", (e) => fmt.number(e.peak_score, 3)],
  ["frames", "Frames", (e) => fmt.count(e.frames)],
];

function eventsPath(cursor) {
  const params = new URLSearchParams(gallery.query);
  params.set("limit", String(PAGE_SIZE));
  if (cursor) params.set("cursor", cursor);
  return `/api/events?${params}`;
}

async function refreshEvents() {
  const generation = gallery.generation;
  let page = await api(eventsPath(null));
  const items = [...page.items];
  // A burst bigger than one page: follow the cursor until the page reaches events already shown.
  for (let pages = 1; gallery.loaded && page.next_cursor && pages < MAX_CATCH_UP_PAGES; pages += 1) {
    if (page.items.some((event) => gallery.entries.has(event.id))) break;
    page = await api(eventsPath(page.next_cursor));
    items.push(...page.items);
  }
  if (generation !== gallery.generation) return;
  if (!gallery.loaded) {
    gallery.olderCursor = page.next_cursor;
    byId("events-older").hidden = !page.next_cursor;
  }
  for (const event of items) upsertEvent(event, gallery.loaded);
  gallery.loaded = true;
  setStatus("events-status", gallery.entries.size ? "" : noEventsText());
}

function noEventsText() {
  if (!gallery.query) return "No events yet; they appear here as edges report them.";
  const asked = [...new URLSearchParams(gallery.query)].map(([name, value]) => `${name} "${value}"`).join(" and ");
  return `No events match ${asked}: "Show all" lists every event.`;
}

async function loadOlderEvents() {
  const button = byId("events-older");
  const generation = gallery.generation;
  button.disabled = true;
  try {
    const page = await api(eventsPath(gallery.olderCursor));
    if (generation !== gallery.generation) return;
    for (const event of page.items) upsertEvent(event, false);
    gallery.olderCursor = page.next_cursor;
    button.hidden = !page.next_cursor;
  } catch (err) {
    setStatus("events-status", `Could not load older events: ${err.message}`, true);
  } finally {
    button.disabled = false;
  }
}

function upsertEvent(event, isNew) {
  let entry = gallery.entries.get(event.id);
  if (!entry) {
    entry = createCard(event);
    gallery.entries.set(event.id, entry);
    insertSorted(entry.card, event);
    if (isNew) entry.card.classList.add("fresh");
  }
  entry.event = event;
  fillCard(entry);
  loadThumbnail(entry);
}

/** Newest first by start time then id: a late arrival (an edge resending after an outage) lands in its place. */
function insertSorted(card, event) {
  const key = [parseTime(event.started_at), event.id];
  const before = [...byId("gallery").children].find((other) => {
    const otherKey = [Number(other.dataset.started), Number(other.dataset.eventId)];
    return otherKey[0] < key[0] || (otherKey[0] === key[0] && otherKey[1] < key[1]);
  });
  card.dataset.started = String(key[0]);
  byId("gallery").insertBefore(card, before || null);
}

function createCard(event) {
  const thumbBox = el("div", { class: "thumb", "data-testid": "event-thumb-box" }, "no image");
  const badge = el("span", { class: "badge", "data-testid": "event-state" });
  const fields = new Map();
  const list = el("dl");
  for (const [key, label] of CARD_FIELDS) {
    const value = el("dd", { "data-field": key, "data-testid": `event-${key}` });
    fields.set(key, value);
    list.append(el("dt", {}, label), value);
  }
  const clip = el("a", { href: localPath(event.clip_url), "data-testid": "event-clip" }, "Play clip");
  clip.addEventListener("click", (click) => {
    click.preventDefault();
    openClip(gallery.entries.get(event.id).event);
  });
  const card = el(
    "article",
    { class: "event-card", "data-testid": "event-card", "data-event-id": event.id, "aria-label": `Event ${event.id}` },
    thumbBox,
    el(
      "div",
      { class: "event-body" },
      el("h3", {}, el("span", { "data-testid": "event-filter" }, event.filter), badge),
      list,
      clip,
      feedbackButtons(event),
    ),
  );
  return { card, event, fields, badge, thumbBox, thumb: "none", blobUrl: null };
}

// ------------------------------------------------------------------------------------------------ feedback

const FEEDBACK = [
  [0, "Wrong", "event-wrong", "a false alarm: all its frames join the filter's dataset, labelled without the event"],
  [1, "Right", "event-right", "the event happened: all its frames join the filter's dataset, labelled with it"],
];
// Whole-event marks label the frames of an event that ran past its occurrence wrongly: the buttons say so.
const PARTLY = " (only some frames show the event? Mark frames…)";

/** "Wrong" and "Right" on an event card: its frames become labels on its filter's dataset (made in the studio).
 * "Mark frames…" labels some of them, one by one: an event that runs past its occurrence, marked "Right" as a whole,
 * teaches the filter its false alarms (bench/feedback.py: whole-event marks lifted no row, frame marks three). */
function feedbackButtons(event) {
  const message = el("p", { class: "message", role: "status", "data-testid": "event-feedback-message" });
  const buttons = FEEDBACK.map(([value, text, testId, title]) => {
    const attrs = { type: "button", class: "secondary small", "data-testid": testId, title: title + PARTLY };
    const button = el("button", attrs, text);
    button.addEventListener("click", () => markEvent(event.id, value, buttons, message));
    return button;
  });
  const title = "label its frames one by one";
  const attrs = { type: "button", class: "secondary small", "data-testid": "event-mark-frames", title };
  const frames = el("button", attrs, "Mark frames…");
  frames.addEventListener("click", () => openMarks(gallery.entries.get(event.id)?.event || event));
  return el("div", { class: "event-feedback" }, ...buttons, frames, message);
}

async function markEvent(eventId, value, buttons, message) {
  for (const button of buttons) button.disabled = true;
  message.className = "message";
  message.textContent = "Adding its frames to the filter's dataset…";
  try {
    const given = await api(`/api/events/${eventId}/feedback`, { method: "POST", json: { value } });
    message.className = "message ok";
    message.textContent = feedbackAnswered(given, value ? "with" : "without");
  } catch (err) {
    message.className = "message error";
    message.textContent = `Not added: ${err.message}`;
  } finally {
    for (const button of buttons) button.disabled = false;
  }
}

// The "Mark frames…" dialog: the event's stored frames, each marked 1 (shows the event), 0 (does not) or not at all.
const MARK_CYCLE = { none: "1", 1: "0", 0: "none" };
let marking = null; // { eventId, buttons, last, lastMark, urls }

async function openMarks(event) {
  const strip = byId("mark-frames");
  closeMarks();
  marking = { eventId: event.id, buttons: [], last: null, lastMark: null, urls: [] };
  const current = marking;
  byId("mark-title").textContent = `Mark frames: ${event.filter} on ${event.camera}, ${fmt.time(event.started_at)}`;
  setMessage("mark-message", "Loading its frames…");
  byId("mark-dialog").showModal();
  let frames;
  try {
    frames = (await api(`/api/events/${event.id}/frames`)).filter((frame) => frame.image_url);
  } catch (err) {
    setMessage("mark-message", `Could not list its frames: ${err.message}`, true);
    return;
  }
  if (current !== marking) return;
  current.buttons = frames.map((frame, index) => markButton(frame, index));
  strip.replaceChildren(...current.buttons);
  setMessage("mark-message", frames.length ? "" : "It has no stored frame with an image left to mark.");
  for (const [index, frame] of frames.entries()) {
    // One at a time: a frame of a stream is decoded on the server.
    if (current !== marking) return;
    await loadMarkImage(current, current.buttons[index], frame);
  }
}

function markButton(frame, index) {
  const box = el("div", { class: "thumb" }, "…");
  const attrs = { type: "button", class: "mark-frame", "data-testid": "mark-frame", "data-frame-id": frame.id };
  const label = el("span", { class: "mark-state" }, `frame ${fmt.count(frame.frame_index)}`);
  const button = el("button", { ...attrs, "data-mark": "none" }, box, label);
  button.addEventListener("click", (click) => markFrames(index, click.shiftKey));
  return button;
}

async function loadMarkImage(current, button, frame) {
  try {
    const blob = await api(frame.image_url, { as: "blob" });
    if (current !== marking) return; // the dialog was closed meanwhile
    const url = URL.createObjectURL(blob);
    current.urls.push(url);
    button.firstChild.replaceChildren(el("img", { src: url, alt: `Frame ${frame.frame_index}` }));
  } catch (err) {
    button.firstChild.textContent = "image unavailable";
    button.title = err.message;
  }
}

/** Marks one frame with the next mark of the cycle; with `range`, every frame since the last one clicked gets the
 * mark that one got. */
function markFrames(index, range) {
  const { buttons } = marking;
  const ranged = range && marking.last !== null;
  const mark = ranged ? marking.lastMark : MARK_CYCLE[buttons[index].dataset.mark];
  const [first, last] = ranged ? [Math.min(marking.last, index), Math.max(marking.last, index)] : [index, index];
  for (let i = first; i <= last; i += 1) buttons[i].dataset.mark = mark;
  marking.last = index;
  marking.lastMark = mark;
  setMessage("mark-message", "");
}

async function saveMarks() {
  if (!marking) return;
  const { eventId, buttons } = marking;
  const marked = (value) => buttons.filter((b) => b.dataset.mark === value).map((b) => Number(b.dataset.frameId));
  const parts = [];
  const save = byId("mark-save");
  save.disabled = true;
  try {
    for (const [value, how] of [["1", "with"], ["0", "without"]]) {
      const frames = marked(value);
      if (!frames.length) continue;
      const json = { value: Number(value), frames };
      const given = await api(`/api/events/${eventId}/feedback`, { method: "POST", json });
      parts.push(feedbackAnswered(given, how));
    }
    setMessage("mark-message", parts.length ? parts.join(" ") : "Mark a frame first: click it.", !parts.length);
  } catch (err) {
    setMessage("mark-message", `Not added: ${err.message}`, true);
  } finally {
    save.disabled = false;
  }
}

function closeMarks() {
  if (marking) for (const url of marking.urls) URL.revokeObjectURL(url);
  marking = null;
  byId("mark-frames").replaceChildren();
}

/** Tells the studio the dataset's new counts (FeedbackOut); what the feedback did, as text. */
function feedbackAnswered(given, how) {
  document.dispatchEvent(new CustomEvent("dataset-changed", { detail: given.dataset }));
  const frames = `${fmt.count(given.labelled)} frame${given.labelled === 1 ? "" : "s"}`;
  return `${frames} labelled ${how} ${given.event} in dataset ${given.dataset.name} (${fmt.count(given.added)} new).`;
}

/** The missed-interval form's cameras: "edge/camera" values, as GET /api/cameras lists them. */
async function loadMissedCameras() {
  let cameras;
  try {
    cameras = await api("/api/cameras");
  } catch (err) {
    setMessage("missed-message", `Could not list the cameras: ${err.message}`, true);
    return;
  }
  setChoices(
    byId("mi-camera"),
    cameras.map((camera) => [`${camera.edge}/${camera.name}`, `${camera.name} (${camera.edge})`]),
    "no camera reported",
  );
}

async function markMissed(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const submit = form.querySelector("[type=submit]");
  const [edge, camera] = form.elements.camera.value.split("/");
  // datetime-local values are the browser's local time; the API takes UTC (the edge's clock)
  const time = (name) => new Date(form.elements[name].value).toISOString();
  const filter = form.elements.filter.value.trim();
  submit.disabled = true;
  setMessage("missed-message", "Adding the interval's frames to the filter's dataset…", false);
  try {
    const body = { edge, camera, start: time("start"), end: time("end") };
    const given = await api(`/api/filters/${encodeURIComponent(filter)}/missed`, { method: "POST", json: body });
    setMessage("missed-message", feedbackAnswered(given, "with"));
  } catch (err) {
    setMessage("missed-message", `Not added: ${err.message}`, true);
  } finally {
    submit.disabled = false;
  }
}

/** Updates the text of a card in place; its thumbnail is left alone. */
function fillCard(entry) {
  const event = entry.event;
  for (const [key, , format] of CARD_FIELDS) entry.fields.get(key).textContent = format(event);
  entry.badge.textContent = event.open ? "open" : "ended";
  entry.badge.className = event.open ? "badge open" : "badge ended";
}

async function loadThumbnail(entry) {
  if (entry.thumb !== "none" || !entry.event.thumbnail_url) return;
  const generation = gallery.generation;
  entry.thumb = "loading";
  try {
    const blob = await api(entry.event.thumbnail_url, { as: "blob" });
    if (generation !== gallery.generation) return;
    entry.blobUrl = URL.createObjectURL(blob);
    const event = entry.event;
    const image = el("img", {
      src: entry.blobUrl,
      alt: `First frame of ${event.filter} on ${event.camera}`,
      "data-testid": "event-thumb",
    });
    entry.thumbBox.replaceChildren(image);
    entry.thumb = "done";
  } catch (err) {
    // A missing image (e.g. removed by retention) stays missing; an outage, an auth problem or an answer to the
    // token given before (TOKEN_CHANGED) is retried next poll.
    entry.thumb = err.status <= 0 || isAuthError(err) ? "none" : "failed";
    entry.thumbBox.textContent = "image unavailable";
    entry.thumbBox.title = err.message;
  }
}

function resetGallery() {
  for (const entry of gallery.entries.values()) if (entry.blobUrl) URL.revokeObjectURL(entry.blobUrl);
  gallery.entries.clear();
  gallery.generation += 1;
  gallery.loaded = false;
  gallery.olderCursor = null;
  byId("gallery").replaceChildren();
  byId("events-older").hidden = true;
}

function applyEventQuery() {
  const params = new URLSearchParams();
  for (const name of ["camera", "filter"]) {
    const value = byId(`ev-${name}`).value.trim();
    if (value) params.set(name, value);
  }
  const query = params.toString();
  if (query === gallery.query) return;
  gallery.query = query;
  resetGallery();
  pollNow();
}

// ----------------------------------------------------------------------------------------------- clip dialog

let clipUrl = null;

async function openClip(event) {
  const dialog = byId("clip-dialog");
  const video = byId("clip-video");
  const message = byId("clip-message");
  byId("clip-title").textContent = `${event.filter} on ${event.camera}, ${fmt.time(event.started_at)}`;
  message.textContent = "Loading clip…";
  video.hidden = true;
  dialog.showModal();
  try {
    const blob = await api(event.clip_url, { as: "blob" });
    closeClipVideo();
    clipUrl = URL.createObjectURL(blob);
    video.src = clipUrl;
    video.hidden = false;
    message.textContent = "";
  } catch (err) {
    message.textContent = `No clip: ${err.message}`;
  }
}

function closeClipVideo() {
  const video = byId("clip-video");
  video.pause();
  video.removeAttribute("src");
  video.load();
  if (clipUrl) URL.revokeObjectURL(clipUrl);
  clipUrl = null;
}

// ------------------------------------------------------------------------------------------------- polling

const SECTIONS = [
  ["filters-status", refreshFilters],
  ["edges-status", refreshEdges],
  ["edges-status", refreshOverview],
  ["events-status", refreshEvents],
];

let pollTimer = null;
let polling = false;
let pollAgain = false;

async function pollOnce() {
  if (!storedToken()) {
    setConnection("signedOut");
    showAuthError("Enter a bearer token (top right) to see this cloud's filters, edges and events.");
    return;
  }
  const results = await Promise.allSettled(SECTIONS.map(([, refresh]) => refresh()));
  const errors = new Map(SECTIONS.map(([statusId]) => [statusId, ""]));
  let authProblem = null;
  results.forEach((result, index) => {
    if (result.status === "fulfilled") return;
    const statusId = SECTIONS[index][0];
    const err = result.reason;
    if (err.status === TOKEN_CHANGED) return; // the poll after this one speaks for the new token
    if (isAuthError(err)) {
      authProblem = authProblem || `${err.status === 401 ? "Not signed in" : "Not allowed"}: ${err.message}`;
    } else {
      errors.set(statusId, errors.get(statusId) || err.message);
    }
  });
  if (authProblem) clearViews(); // what is shown was read with a token that reads nothing now
  for (const [statusId, message] of errors) {
    if (message) setStatus(statusId, message, true);
    else if (byId(statusId).classList.contains("error")) setStatus(statusId, "");
  }
  showAuthError(authProblem);
}

/** Empties every view of the cloud's data (Forget, or a refused token): no earlier session's data stays on screen.
 * The next poll with a token that reads fills them again. */
function clearViews() {
  filtersSignature = "";
  for (const id of ["filters-body", "edges-body", "cameras-body", "stats-strip", "mi-camera"]) {
    byId(id).replaceChildren();
  }
  for (const id of ["filter-names", "camera-names"]) {
    byId(id).replaceChildren();
    delete byId(id).dataset.values;
  }
  for (const [statusId] of SECTIONS) setStatus(statusId, "");
  resetGallery();
  for (const id of ["mark-dialog", "clip-dialog"]) byId(id).close();
  document.dispatchEvent(new Event("signed-out")); // the studio's views (studio.js)
}

/** Runs one poll now (or right after the one in flight), then every POLL_MS; never two at once. */
async function pollNow() {
  clearTimeout(pollTimer);
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  try {
    await pollOnce();
  } finally {
    polling = false;
    pollTimer = setTimeout(pollNow, pollAgain ? 0 : POLL_MS);
    pollAgain = false;
  }
}

// ------------------------------------------------------------------------------------------------ wiring

async function loadArchitectures() {
  // The MC kinds are FilterSpec's enum in the API schema, so a kind added to the registry shows up here too.
  const response = await fetch(localPath("/openapi.json"));
  if (!response.ok) throw new Error(`the API schema could not be read (HTTP ${response.status}): reload the page`);
  const kinds = (await response.json()).components.schemas.FilterSpec.properties.architecture.enum;
  byId("f-architecture").replaceChildren(...kinds.map((kind) => el("option", { value: kind }, kind)));
}

function debounce(fn, ms) {
  let timer = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(fn, ms);
  };
}

function init() {
  const tokenInput = byId("token-input");
  tokenInput.value = storedToken();
  byId("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
    filtersSignature = "";
    document.dispatchEvent(new Event("token-saved")); // labels held for a token that may write go now (studio.js)
    pollNow();
  });
  byId("token-clear").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    tokenInput.value = "";
    clearViews();
    pollNow();
  });
  byId("filter-form").addEventListener("submit", registerFilter);
  byId("f-spec").addEventListener("change", loadSpecFile);
  const eventFilters = byId("event-filters");
  eventFilters.addEventListener("input", debounce(applyEventQuery, 300));
  eventFilters.addEventListener("submit", (event) => {
    event.preventDefault();
    applyEventQuery();
  });
  eventFilters.addEventListener("reset", () => setTimeout(applyEventQuery, 0)); // values are cleared after the event
  byId("events-older").addEventListener("click", loadOlderEvents);
  byId("missed-details").addEventListener("toggle", (event) => {
    if (event.currentTarget.open) loadMissedCameras();
  });
  byId("missed-form").addEventListener("submit", markMissed);
  byId("clip-dialog").addEventListener("close", closeClipVideo);
  byId("mark-dialog").addEventListener("close", closeMarks);
  byId("mark-save").addEventListener("click", saveMarks);
  loadArchitectures().catch((error) => setMessage("filter-form-message", error.message, true));
  pollNow();
}

document.addEventListener("DOMContentLoaded", init);
