"use strict";
// The filter studio (docs/studio.md): datasets from edge cameras or uploaded clips, labelling by keyboard, event
// regions, training jobs and deployment, improving a filter and its revisions. Plain JS loaded after app.js, whose
// helpers it uses (api, el, byId, setStatus, setMessage, fmt, SECTIONS, pollNow, refreshFilters).
//
// Labels are applied on the page at once and sent in small ordered batches (PUT .../labels, debounced): a batch
// that fails stays first in line and is retried until it is stored, so no label is lost or applied out of order.
// A token without the write scope is not retried: its labels wait in the page for a token that may write them.

const LABEL_DEBOUNCE_MS = 300; // quiet time before a batch of labels is sent
const LABEL_MAX_WAIT_MS = 1000; // ... but a batch never waits longer than this while keys keep coming
const LABEL_BATCH_MAX = 500; // labels per PUT
const RETRY_MS = [1000, 2000, 5000, 10000]; // waits before retrying a failed PUT, the last one repeated
const PRELOAD_AHEAD = 8; // frames fetched ahead of the current one, so moving on is instant
const PRELOAD_BEHIND = 2;
const STRIP_RADIUS = 7; // thumbnails either side of the current frame
const FRAME_CACHE_SIZE = 200; // frame images kept as blob URLs
const DATASETS_IDLE_POLLS = 5; // with nothing recording, the list is read again every this many polls (10 s)
const TRAINING_POLL_MS = 2000;
const EXAMPLES_SHOWN = 8; // example frames shown per kind (hits, false alarms, misses)
const UNCERTAIN_SHOWN = 12; // frames to label next shown (the ones a filter is least sure about)

const LABELS = { 1: "event", 0: "not", "-1": "uncertain" };
const LABEL_BY_KEY = { 1: 1, 0: 0, u: -1, U: -1, x: null, X: null, Delete: null };
const LABEL_BY_CODE = { Digit1: 1, Numpad1: 1, Digit0: 0, Numpad0: 0, KeyU: -1, KeyX: null };
const ACTIVE_STATUSES = new Set(["requested", "recording"]);

const datasetPath = (name, rest = "") => `/api/datasets/${encodeURIComponent(name)}${rest}`;
const labelClass = (value) => (value === undefined ? "unlabelled" : value === -1 ? "label-u" : `label-${value}`);

function range(from, to) {
  const frames = [];
  for (let frame = Math.min(from, to); frame <= Math.max(from, to); frame += 1) frames.push(frame);
  return frames;
}

const plural = (count, noun) => `${fmt.count(count)} ${noun}${count === 1 ? "" : "s"}`;

// ------------------------------------------------------------------------------------------------- datasets

const datasetList = {
  byName: new Map(), // name -> DatasetOut, as last read
  signature: "",
  loaded: false,
  stale: true, // read again at the next poll (after a change made here)
  polls: 0,
};

async function refreshDatasets() {
  datasetList.polls += 1;
  // An open footage form that offers no online edge yet lists them again: the edge may have connected since.
  if (byId("footage-details").open && !footageEdges.some((edge) => edge.online)) loadFootageChoices();
  const active = [...datasetList.byName.values()].some((dataset) => ACTIVE_STATUSES.has(dataset.status));
  if (datasetList.loaded && !datasetList.stale && !active && datasetList.polls % DATASETS_IDLE_POLLS !== 0) return;
  datasetList.stale = false;
  let datasets;
  try {
    datasets = await api("/api/datasets");
  } catch (err) {
    datasetList.stale = true; // read again at the next poll, not at the next idle round
    throw err;
  }
  datasetList.loaded = true;
  datasetList.byName = new Map(datasets.map((dataset) => [dataset.name, dataset]));
  syncStudioDataset();
  openLinked();
  const signature = JSON.stringify(datasets);
  if (signature === datasetList.signature) return;
  datasetList.signature = signature;
  const rows = datasets.map(datasetRow);
  byId("datasets-body").replaceChildren(
    ...(rows.length ? rows : [emptyRow(6, "No datasets yet: request footage from a camera or upload a clip.")]),
  );
}

function refreshDatasetsNow() {
  datasetList.stale = true;
  pollNow();
}

/** Signed out (app.js clearViews): the datasets, the footage form's edges and the open dataset go; labels not saved
 * yet stay queued and are sent once a token is given again. */
function clearStudioViews() {
  closeStudio();
  Object.assign(datasetList, { byName: new Map(), signature: "", loaded: false, stale: true });
  byId("datasets-body").replaceChildren();
  footageEdges = [];
  for (const id of ["fo-edge", "fo-camera"]) byId(id).replaceChildren();
}

function datasetRow(dataset) {
  const label = el(
    "button",
    { type: "button", class: "secondary", "data-testid": "dataset-label", "aria-label": `Label ${dataset.name}` },
    "Label",
  );
  label.addEventListener("click", () => openStudio(dataset.name));
  const remove = el(
    "button",
    {
      type: "button",
      class: "danger",
      "data-testid": "dataset-delete",
      "aria-label": `Delete dataset ${dataset.name}`,
    },
    "Delete",
  );
  remove.addEventListener("click", () => deleteDataset(dataset.name, remove));
  return el(
    "tr",
    { "data-testid": "dataset-row", "data-name": dataset.name },
    el("th", { scope: "row", "data-field": "name" }, dataset.name),
    el("td", { "data-field": "source" }, sourceText(dataset)),
    el(
      "td",
      // A message is a refusal's reason, or what complete footage lacks (seconds its camera was offline).
      { "data-field": "status", class: dataset.message ? "warn" : null, title: dataset.message || null },
      dataset.message ? `${dataset.status}: ${dataset.message}` : dataset.status,
    ),
    numCell("frames", framesText(dataset)),
    el("td", { "data-field": "events", class: "events-cell" }, ...eventSummaries(dataset)),
    el("td", { class: "actions" }, label, remove),
  );
}

function sourceText(dataset) {
  if (dataset.source !== "footage") return "uploaded clip";
  const every = dataset.every > 0 ? `every ${dataset.every} s` : "every frame";
  return `${dataset.edge} / ${dataset.camera}, ${every}`;
}

function framesText(dataset) {
  const expected = dataset.expected;
  return typeof expected === "number" && expected !== dataset.frames
    ? `${fmt.count(dataset.frames)} / ${fmt.count(expected)}`
    : fmt.count(dataset.frames);
}

/** One line per event: labelled frames (event / not / uncertain) and occurrences. */
function eventSummaries(dataset) {
  const events = Object.entries(dataset.events || {});
  if (!events.length) return ["—"];
  return events.map(([event, counts]) =>
    el(
      "div",
      { "data-event": event },
      el("strong", {}, event),
      `: ${fmt.count(counts.labelled)} labelled (${fmt.count(counts.positive)} event / ${fmt.count(counts.negative)} ` +
        `not / ${fmt.count(counts.uncertain)} uncertain), ${plural(counts.occurrences, "occurrence")}`,
    ),
  );
}

async function deleteDataset(name, button) {
  if (!confirm(`Delete dataset "${name}" with its frames and labels? This cannot be undone.`)) return;
  button.disabled = true;
  try {
    await api(datasetPath(name), { method: "DELETE" });
    setStatus("datasets-status", `Deleted ${name}.`);
    if (studio.dataset && studio.dataset.name === name) closeStudio();
    refreshDatasetsNow();
  } catch (err) {
    setStatus("datasets-status", `Could not delete ${name}: ${err.message}`, true);
    button.disabled = false;
  }
}

// ------------------------------------------------------------------------------------ footage and uploads

let footageEdges = []; // EdgeOut list the footage form offers

async function loadFootageChoices() {
  const select = byId("fo-edge");
  try {
    footageEdges = await api("/api/edges");
  } catch (err) {
    setMessage("footage-message", `Could not list the edges: ${err.message}`, true);
    return;
  }
  const choices = footageEdges.map((edge) => [edge.id, edge.online ? edge.id : `${edge.id} (offline)`]);
  setChoices(select, choices, "no edge has connected");
  fillFootageCameras();
}

function fillFootageCameras() {
  const edge = footageEdges.find((candidate) => candidate.id === byId("fo-edge").value);
  const cameras = edge ? edge.cameras : [];
  setChoices(byId("fo-camera"), cameras.map((camera) => [camera, camera]), "no camera");
}

async function requestFootage(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const value = (name) => form.elements[name].value.trim();
  const order = {
    name: value("name"),
    edge: value("edge"),
    camera: value("camera"),
    every: Number(value("every")),
    duration: Number(value("duration")),
    max_frames: Number(value("max_frames")),
  };
  await submitting(form, "footage-message", "Asking the edge…", async () => {
    const dataset = await api("/api/datasets/footage", { method: "POST", json: order });
    form.elements.name.value = "";
    refreshDatasetsNow();
    return `Requested ${dataset.name} from ${dataset.edge} / ${dataset.camera}: the edge records it, then sends it.`;
  });
}

async function uploadClip(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const body = new FormData();
  body.append("name", form.elements.name.value.trim());
  body.append("every", form.elements.every.value.trim() || "0");
  body.append("video", form.elements.video.files[0]);
  await submitting(form, "upload-message", "Uploading and decoding the clip…", async () => {
    const dataset = await api("/api/datasets/upload", { method: "POST", body });
    form.elements.name.value = "";
    form.elements.video.value = "";
    refreshDatasetsNow();
    return `Uploaded ${dataset.name}: ${plural(dataset.frames, "frame")}${rateText(dataset)}.`;
  });
}

/** " at 5.0 fps" (or ", one every 60 s"), or "" where a rate says nothing: one frame, or none known. */
function rateText(dataset) {
  const fps = dataset.fps;
  if (dataset.frames < 2 || typeof fps !== "number" || !(fps > 0)) return "";
  return fps >= 0.1 ? ` at ${fmt.number(fps, 1)} fps` : `, one every ${fmt.number(1 / fps, 0)} s`;
}

/** Clears a panel's error once a later request of that panel succeeded: the server is back, or what failed is past
 * (an answer shown there, not an error, stays). */
function clearError(messageId) {
  if (byId(messageId).classList.contains("error")) setMessage(messageId, "");
}

/** Runs `action` with the form's submit button disabled; its answer (or the server's refusal) in `messageId`. */
async function submitting(form, messageId, busyText, action) {
  const submit = form.querySelector("[type=submit]");
  submit.disabled = true;
  setMessage(messageId, busyText);
  try {
    setMessage(messageId, await action());
  } catch (err) {
    setMessage(messageId, `Not done: ${err.message}`, true);
  } finally {
    submit.disabled = false;
  }
}

// ------------------------------------------------------------------------------------------ link to the studio

// The open dataset and event are kept in the URL hash, #studio=<dataset>/<event> (each URL-encoded), so a reload or a
// shared link opens them again once the datasets are read.
const STUDIO_LINK = /^#studio=([^/]*)(?:\/(.*))?$/;
let studioLink = null; // {dataset, event} the hash asks to open, until the datasets are read; null: none

function readStudioLink() {
  const match = STUDIO_LINK.exec(location.hash);
  if (!match) return null;
  const decoded = (text) => {
    try {
      return decodeURIComponent(text);
    } catch {
      return text; // a malformed escape: said as it is, as a dataset not here
    }
  };
  return { dataset: decoded(match[1]), event: match[2] ? decoded(match[2]) : null };
}

/** The hash names the open dataset and event (or nothing, for null); replaced, so Back still leaves the page. */
function writeStudioLink(dataset, event = "") {
  const name = dataset === null ? "" : `#studio=${encodeURIComponent(dataset)}`;
  const hash = name && event ? `${name}/${encodeURIComponent(event)}` : name;
  if (hash !== location.hash) history.replaceState(null, "", hash || location.pathname + location.search);
}

/** Opens what the hash asked for, once the datasets are read; a dataset not here is said, and the hash cleared. */
function openLinked() {
  const link = studioLink;
  studioLink = null;
  if (!link) return;
  if (datasetList.byName.has(link.dataset)) {
    openStudio(link.dataset, link.event);
    return;
  }
  writeStudioLink(null);
  // Not an error status: the poll clears those once the table reads again, before anyone could see it.
  setStatus("datasets-status", `The link names dataset ${link.dataset}, which is not here (deleted, or never made).`);
}

/** A link given to this tab (the address bar, or a click): opened now if the datasets are read, else once they are. */
function followStudioLink() {
  studioLink = readStudioLink();
  if (datasetList.loaded) openLinked();
}

// ------------------------------------------------------------------------------------------- frame images

const frameCache = {
  dataset: "",
  urls: new Map(), // frame -> Promise of a blob URL, least recently used first
};

/** The frame's image as a blob URL (fetched once with the token; <img> cannot send it). */
function frameUrl(number) {
  const name = studio.dataset.name;
  if (frameCache.dataset !== name) clearFrameCache(name);
  let url = frameCache.urls.get(number);
  if (url) {
    frameCache.urls.delete(number); // most recently used: last
  } else {
    url = api(datasetPath(name, `/frames/${number}.jpg`), { as: "blob" }).then((blob) => URL.createObjectURL(blob));
    url.catch(() => {
      if (frameCache.urls.get(number) === url) frameCache.urls.delete(number); // asked again next time
    });
  }
  frameCache.urls.set(number, url);
  evictFrames();
  return url;
}

function evictFrames() {
  while (frameCache.urls.size > FRAME_CACHE_SIZE) {
    const [oldest, url] = frameCache.urls.entries().next().value;
    frameCache.urls.delete(oldest);
    url.then(URL.revokeObjectURL, () => {});
  }
}

function clearFrameCache(name) {
  for (const url of frameCache.urls.values()) url.then(URL.revokeObjectURL, () => {});
  frameCache.urls.clear();
  frameCache.dataset = name;
}

function preloadAround(number) {
  for (let frame = number - PRELOAD_BEHIND; frame <= number + PRELOAD_AHEAD; frame += 1) {
    if (frame >= 0 && frame < frameTotal()) frameUrl(frame).catch(() => {});
  }
}

/** Shows the frame's image in `img` once loaded, unless `img` was given another frame meanwhile. */
async function showImage(img, number) {
  img.dataset.want = String(number);
  try {
    const url = await frameUrl(number);
    if (img.dataset.want !== String(number)) return;
    img.src = url;
    img.dataset.frame = String(number);
    img.removeAttribute("title");
  } catch (err) {
    if (img.dataset.want !== String(number)) return;
    img.removeAttribute("src");
    delete img.dataset.frame;
    img.title = `frame ${number}: ${err.message}`;
  }
}

// ------------------------------------------------------------------------------------------ labelling view

const studio = {
  dataset: null, // DatasetOut of the open dataset
  event: "", // the event being labelled ("" until one is chosen)
  frame: 0, // the current frame
  labels: new Map(), // frame -> 1 | 0 | -1 for the event, unsaved changes included
  loaded: false, // the event's stored labels have been read: labelling may start
  anchor: null, // where a Shift+arrow selection started, or null
  lastLabelled: null, // the frame labelled last (Shift+label labels from there)
  draft: [], // region points being drawn, normalised [x, y]
  generation: 0, // bumped when the dataset or event changes: answers for the old one are dropped
};

const frameTotal = () => (studio.dataset ? studio.dataset.frames : 0);

/** Opens the dataset at `event` (by default the one open before, else its first). */
async function openStudio(name, event = null) {
  const dataset = datasetList.byName.get(name);
  if (!dataset) return;
  const previous = studio.dataset && studio.dataset.name;
  studio.dataset = dataset;
  if (previous !== name) {
    studio.frame = 0;
    studio.event = "";
    clearFrameCache(name);
  }
  byId("studio").hidden = false;
  byId("studio-dataset").textContent = name;
  const stage = byId("stage");
  if (dataset.width && dataset.height) stage.style.aspectRatio = `${dataset.width} / ${dataset.height}`;
  fillEventChoices();
  fillTrainingKinds();
  const events = knownEvents(dataset);
  const loading = chooseEvent(event ?? (events.includes(studio.event) ? studio.event : events[0] || ""));
  byId("studio").scrollIntoView({ block: "start" });
  await focusWhenLoaded(loading, studio.event ? stage : byId("studio-event"));
}

/** Focuses `target` once the event's labels are read, unless the user moved the focus or opened another event
 * meanwhile: the focus jumping to the frame under someone typing an event name turns their keys into labels. */
async function focusWhenLoaded(loading, target) {
  const generation = studio.generation;
  const focused = document.activeElement;
  await loading;
  if (generation === studio.generation && document.activeElement === focused) target.focus({ preventScroll: true });
}

function closeStudio() {
  if (studio.dataset) writeStudioLink(null); // left alone while none is open: a link still to open stays
  studio.generation += 1;
  studio.dataset = null;
  studio.event = "";
  studio.draft = [];
  stopTrainingPoll();
  training.job = null;
  revisionsOf.filter = "";
  for (const id of ["training", "revisions"]) byId(id).replaceChildren();
  byId("studio").hidden = true;
}

/** The open dataset as the list last read it (frames arrive while an edge records). */
function syncStudioDataset() {
  if (!studio.dataset) return;
  const fresh = datasetList.byName.get(studio.dataset.name);
  if (!fresh) {
    const name = studio.dataset.name;
    closeStudio();
    // Not an error status: the poll clears those once the table reads again, before anyone could see it.
    setStatus("datasets-status", `Dataset ${name}, open for labelling, was deleted (elsewhere): the studio closed.`);
    return;
  }
  const grew = fresh.frames !== studio.dataset.frames;
  // Another tab (or the gallery's feedback) labelled the open event: read its labels again, or this strip shows
  // the old ones while the counts show the new (labels not saved yet stay on top: loadLabels).
  const counts = (dataset) => JSON.stringify((dataset.events || {})[studio.event] || null);
  const relabelled = studio.event && studio.loaded && counts(fresh) !== counts(studio.dataset);
  studio.dataset = fresh;
  fillEventChoices();
  renderCounts();
  if (relabelled) loadLabels(studio.generation);
  if (grew) renderFrame();
}

const knownEvents = (dataset) =>
  [...new Set([...Object.keys(dataset.events || {}), ...Object.keys(dataset.regions || {})])].sort();

function fillEventChoices() {
  setOptions(byId("studio-events"), knownEvents(studio.dataset));
}

/** Opens `event` of the open dataset: its labels (with the ones not saved yet), region and training jobs. */
async function chooseEvent(event) {
  studio.generation += 1;
  const generation = studio.generation;
  studio.event = event;
  studio.labels = new Map();
  studio.loaded = false;
  studio.anchor = null;
  studio.lastLabelled = null;
  studio.draft = [];
  byId("studio-event").value = event;
  writeStudioLink(studio.dataset.name, event);
  byId("train-filter").value = event ? defaultFilterName(studio.dataset.name, event) : "";
  setMessage("region-message", "");
  setMessage("train-message", "");
  byId("training").replaceChildren();
  byId("revisions").replaceChildren();
  setMessage("revisions-message", "");
  revisionsOf.filter = "";
  training.job = null;
  training.previous = null;
  stopTrainingPoll();
  renderAll();
  if (!event) {
    setStatus("save-state", "Type or pick the event to label, then press Enter.");
    return;
  }
  setStatus("save-state", "Reading the labels…");
  if (await loadLabels(generation)) showLatestTrainingJob(generation);
}

/** The open event's stored labels with the ones not saved yet on top; false when they could not be read. */
async function loadLabels(generation) {
  const event = studio.event;
  try {
    const answer = await api(datasetPath(studio.dataset.name, `/labels?event=${encodeURIComponent(event)}`));
    if (generation !== studio.generation) return false;
    const stored = (answer && answer[event]) || {};
    studio.labels = new Map(Object.entries(stored).map(([frame, value]) => [Number(frame), value]));
    for (const [frame, value] of unsavedLabels()) {
      if (value === null) studio.labels.delete(frame);
      else studio.labels.set(frame, value);
    }
    studio.loaded = true;
  } catch (err) {
    if (generation === studio.generation) setStatus("save-state", `Could not read the labels: ${err.message}`, true);
    return false;
  }
  renderAll();
  refreshImprove();
  return true;
}

/** A filter name from the dataset and event (FilterSpec's name pattern). */
function defaultFilterName(dataset, event) {
  const name = `${dataset}-${event}`.toLowerCase().replace(/[^a-z0-9_.-]+/g, "-");
  return name.replace(/^[^a-z0-9]+/, "").slice(0, 64) || "filter";
}

function renderAll() {
  renderCounts();
  renderFrame();
  renderRegion();
  renderSaveState();
}

function renderCounts() {
  const counts = (studio.event && studio.dataset && (studio.dataset.events || {})[studio.event]) || {};
  const items = [
    ["labelled", "labelled", counts.labelled],
    ["positive", "event", counts.positive],
    ["negative", "not", counts.negative],
    ["uncertain", "uncertain", counts.uncertain],
    ["occurrences", "occurrences", counts.occurrences],
  ];
  byId("studio-counts").replaceChildren(
    ...items.map(([key, label, value]) =>
      el("div", { "data-field": key }, el("dt", {}, label), el("dd", {}, fmt.count(value || 0))),
    ),
  );
}

function renderFrame() {
  const number = studio.frame;
  const total = frameTotal();
  byId("stage").dataset.frame = String(number);
  byId("frame-position").textContent = total ? `Frame ${number} of 0–${total - 1}` : "No frames yet";
  const value = studio.labels.get(number);
  const badge = byId("frame-label");
  badge.textContent = studio.event ? (value === undefined ? "unlabelled" : LABELS[value]) : "";
  badge.className = `label-badge ${labelClass(value)}`;
  const selection = selectedFrames();
  byId("frame-selection").textContent = selection.length > 1 ? `${selection.length} frames selected` : "";
  if (total) {
    showImage(byId("frame-image"), number);
    preloadAround(number);
  }
  renderStrip();
}

function renderStrip() {
  const strip = byId("frame-strip");
  if (strip.children.length !== 2 * STRIP_RADIUS + 1) {
    strip.replaceChildren(...range(0, 2 * STRIP_RADIUS).map(stripItem));
  }
  const selected = new Set(selectedFrames().length > 1 ? selectedFrames() : []);
  const unsaved = new Set(unsavedLabels().keys());
  [...strip.children].forEach((item, index) => {
    const frame = studio.frame - STRIP_RADIUS + index;
    const inside = frame >= 0 && frame < frameTotal();
    if (!inside) {
      item.className = "strip-item outside"; // keeps its place: the current frame stays in the middle
      delete item.dataset.frame;
      item.querySelector("img").dataset.want = "";
      return;
    }
    const value = studio.labels.get(frame);
    item.dataset.frame = String(frame);
    item.className = [
      "strip-item",
      labelClass(value),
      frame === studio.frame ? "current" : "",
      selected.has(frame) ? "selected" : "",
      unsaved.has(frame) ? "unsaved" : "",
    ].join(" ");
    item.title = `frame ${frame}: ${value === undefined ? "unlabelled" : LABELS[value]}`;
    item.querySelector(".strip-number").textContent = String(frame);
    showImage(item.querySelector("img"), frame);
  });
}

function stripItem() {
  const image = el("img", { alt: "" });
  const button = el("button", { type: "button", tabindex: "-1" }, image, el("span", { class: "strip-number" }));
  button.addEventListener("click", () => {
    moveTo(Number(item.dataset.frame), false);
    byId("stage").focus({ preventScroll: true });
  });
  const item = el("li", { "data-testid": "strip-item" }, button);
  return item;
}

function moveTo(frame, extend) {
  const total = frameTotal();
  if (!total) return;
  if (extend && studio.anchor === null) studio.anchor = studio.frame;
  if (!extend) studio.anchor = null;
  studio.frame = Math.min(Math.max(frame, 0), total - 1);
  renderFrame();
}

const selectedFrames = () => (studio.anchor === null ? [studio.frame] : range(studio.anchor, studio.frame));

/** The frames a label key labels: the selection, or with Shift those after the last labelled up to this one. */
function framesToLabel(run) {
  if (studio.anchor !== null || !run || studio.lastLabelled === null || studio.lastLabelled === studio.frame) {
    return selectedFrames();
  }
  const step = studio.frame > studio.lastLabelled ? 1 : -1;
  return range(studio.lastLabelled + step, studio.frame);
}

/** Labels (value 1, 0, -1) or unlabels (null) frames; a label moves on to the frame after them. */
function labelKey(value, run) {
  if (!studio.event) {
    setStatus("save-state", "Type or pick the event to label first.", true);
    byId("studio-event").focus();
    return;
  }
  if (!frameTotal() || !studio.loaded) return;
  const frames = framesToLabel(run);
  for (const frame of frames) {
    if (value === null) studio.labels.delete(frame);
    else studio.labels.set(frame, value);
  }
  queueLabels(studio.dataset.name, studio.event, frames, value);
  refreshImprove();
  studio.anchor = null;
  if (value === null) {
    renderFrame();
    return;
  }
  studio.lastLabelled = studio.frame;
  moveTo(Math.max(...frames) + 1, false);
}

function onStudioKey(event) {
  if (!studio.dataset || byId("studio").hidden || event.ctrlKey || event.metaKey || event.altKey) return;
  const target = event.target;
  if (!(target instanceof Element)) return;
  // keys label only while the page or the studio has the focus, never while typing
  if (target !== document.body && !target.closest("#studio")) return;
  if (target.closest("input, select, textarea, [contenteditable]")) return;
  const onButton = target.closest("button, a, summary");
  const value = event.key in LABEL_BY_KEY ? LABEL_BY_KEY[event.key] : LABEL_BY_CODE[event.code];
  if (value !== undefined) {
    labelKey(value, event.shiftKey && !event.repeat); // a held key repeats: frame after frame
  } else if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
    moveTo(studio.frame + (event.key === "ArrowRight" ? 1 : -1), event.shiftKey);
  } else if (event.key === "Home" || event.key === "End") {
    moveTo(event.key === "Home" ? 0 : frameTotal() - 1, event.shiftKey);
  } else if (event.key === "Enter" && !onButton) {
    closePolygon();
  } else if (event.key === "Escape") {
    cancelPolygon();
    studio.anchor = null;
    renderFrame();
  } else {
    return;
  }
  event.preventDefault();
}

function onLabelButton(event) {
  const button = event.currentTarget;
  if (button.dataset.move) {
    moveTo(studio.frame + Number(button.dataset.move), false);
  } else {
    labelKey(button.dataset.label === "" ? null : Number(button.dataset.label), false);
  }
  byId("stage").focus({ preventScroll: true });
}

// ------------------------------------------------------------------------------------- saving the labels

const outbox = {
  batches: [], // [{dataset, event, labels: Map(frame -> value), sending}], oldest first: sent in this order
  timer: null,
  firstQueued: 0, // when the oldest unsent label was queued
  failures: 0, // failed PUTs in a row
  error: "", // why the first batch failed (it is retried)
  refused: "", // why the server refused a batch for good (shown until the next one is stored)
  forbidden: false, // the token may not write labels (403): nothing is sent until another token is saved
  waiters: [], // {resolve, reject} of promises waiting for the outbox to empty
};

// Refusals no retry can change (a frame outside the dataset, an event name the server refuses, a deleted dataset):
// the batch is dropped, the refusal shown, and the event's labels read again so the page shows what is stored.
// A token without the write scope (403) holds every batch until a token is saved (tokenSaved). Every other failure
// (no network, a token refused, a busy database) is retried until the batch is stored.
const REFUSED_FOR_GOOD = new Set([400, 404, 413, 422]);

function queueLabels(dataset, event, frames, value) {
  let batch = outbox.batches.at(-1);
  const fits = batch && !batch.sending && batch.dataset === dataset && batch.event === event;
  if (!fits || batch.labels.size >= LABEL_BATCH_MAX) {
    batch = { dataset, event, labels: new Map(), sending: false };
    outbox.batches.push(batch);
  }
  for (const frame of frames) {
    batch.labels.delete(frame); // the newest value, in the order given
    batch.labels.set(frame, value);
  }
  if (!outbox.firstQueued) outbox.firstQueued = Date.now();
  if (!outbox.error && !outbox.forbidden) {
    const wait = Math.min(LABEL_DEBOUNCE_MS, Math.max(0, outbox.firstQueued + LABEL_MAX_WAIT_MS - Date.now()));
    scheduleFlush(wait);
  }
  renderSaveState();
}

function scheduleFlush(ms) {
  clearTimeout(outbox.timer);
  outbox.timer = setTimeout(flushLabels, ms);
}

/** Sends the oldest batch; on success the next one follows at once, on failure it is retried after a wait. */
async function flushLabels() {
  outbox.timer = null;
  const batch = outbox.batches[0];
  if (!batch || batch.sending) return;
  batch.sending = true;
  outbox.firstQueued = 0;
  const labels = [...batch.labels].map(([frame, value]) => ({ frame, value }));
  try {
    const dataset = await api(datasetPath(batch.dataset, "/labels"), {
      method: "PUT",
      json: { event: batch.event, labels },
    });
    outbox.batches.shift();
    outbox.failures = 0;
    outbox.error = "";
    outbox.refused = "";
    outbox.forbidden = false;
    datasetAnswered(dataset);
  } catch (err) {
    batch.sending = false;
    if (REFUSED_FOR_GOOD.has(err.status)) {
      labelsRefused(batch, err.message);
    } else if (err.status === 403) {
      labelsForbidden();
    } else {
      outbox.failures += 1;
      outbox.error = err.message;
      for (const waiter of outbox.waiters.splice(0)) waiter.reject(new Error(`labels not saved yet: ${err.message}`));
    }
  }
  if (!outbox.batches.length) {
    for (const waiter of outbox.waiters.splice(0)) waiter.resolve();
  } else if (!outbox.forbidden) {
    const retry = RETRY_MS[Math.min(outbox.failures, RETRY_MS.length) - 1];
    scheduleFlush(outbox.error ? retry : 0);
  }
  renderSaveState();
  if (studio.dataset) renderStrip();
}

function labelsRefused(batch, detail) {
  outbox.batches.shift();
  outbox.failures = 0;
  outbox.error = "";
  outbox.refused = `${plural(batch.labels.size, "label")} of "${batch.event}" refused by the server: ${detail}`;
  if (studio.dataset && studio.dataset.name === batch.dataset && studio.event === batch.event) {
    loadLabels(studio.generation);
  }
}

/** A token that may read but not write: retrying cannot help, but the labels are the user's work, so they stay
 * queued (and shown) until a token is saved, and are sent then (tokenSaved). */
function labelsForbidden() {
  outbox.forbidden = true;
  outbox.failures = 0;
  outbox.error = "";
  for (const waiter of outbox.waiters.splice(0)) waiter.reject(forbiddenError());
}

const forbiddenError = () => new Error(`${plural(unsavedCount(), "label")} not saved: this token may not write labels`);

/** A token was saved (app.js): labels held back or failing are sent with it now, not at the next retry. */
function tokenSaved() {
  if (!outbox.batches.length) return;
  outbox.forbidden = false;
  scheduleFlush(0);
  renderSaveState();
}

/** The dataset as a PUT answered it: its counts are the live ones. */
function datasetAnswered(dataset) {
  if (!dataset || !dataset.name) return;
  datasetList.byName.set(dataset.name, dataset);
  datasetList.stale = true; // the table shows the new counts at the next poll
  if (studio.dataset && studio.dataset.name === dataset.name) {
    studio.dataset = dataset;
    fillEventChoices();
    renderCounts();
  }
}

/** Feedback from the event gallery (app.js) changed a dataset: its counts, and the labels if it is open. */
function feedbackGiven(dataset) {
  datasetAnswered(dataset);
  if (studio.dataset && studio.dataset.name === dataset.name && studio.event) loadLabels(studio.generation);
}

/** The open event's labels not stored yet, oldest change first: frame -> value (null: removed). */
function unsavedLabels() {
  const unsaved = new Map();
  if (!studio.dataset) return unsaved;
  for (const batch of outbox.batches) {
    if (batch.dataset !== studio.dataset.name || batch.event !== studio.event) continue;
    for (const [frame, value] of batch.labels) unsaved.set(frame, value);
  }
  return unsaved;
}

const unsavedCount = () => outbox.batches.reduce((sum, batch) => sum + batch.labels.size, 0);

/** Resolves once every label is stored; sends what waits now. Rejects when a PUT is failing. */
function labelsSaved() {
  if (!outbox.batches.length) return Promise.resolve();
  if (outbox.forbidden) return Promise.reject(forbiddenError());
  if (outbox.error) return Promise.reject(new Error(`${plural(unsavedCount(), "label")} not saved yet: ${outbox.error}`));
  if (outbox.timer) scheduleFlush(0);
  return new Promise((resolve, reject) => outbox.waiters.push({ resolve, reject }));
}

function renderSaveState() {
  const count = unsavedCount();
  const node = byId("save-state");
  node.dataset.unsaved = String(count);
  if (outbox.forbidden) {
    const text =
      `${plural(count, "label")} not saved: this token may not write labels. They are kept in this page and sent ` +
      "once a token with the write scope is saved (top right).";
    setStatus("save-state", text, true);
  } else if (outbox.error) {
    const wait = RETRY_MS[Math.min(outbox.failures, RETRY_MS.length) - 1] / 1000;
    const text = `${plural(count, "label")} not saved yet: ${outbox.error} (retrying every ${wait} s)`;
    setStatus("save-state", text, true);
    node.append(" ", retryButton());
  } else if (count) {
    setStatus("save-state", `Saving ${plural(count, "label")}…`);
  } else if (outbox.refused) {
    setStatus("save-state", outbox.refused, true);
  } else if (studio.event) {
    setStatus("save-state", "All labels saved.");
  }
}

function retryButton() {
  const button = el("button", { type: "button", class: "secondary small", "data-testid": "save-retry" }, "Retry now");
  button.addEventListener("click", () => scheduleFlush(0));
  return button;
}

// ------------------------------------------------------------------------------------------ event regions

/** Clicks on the frame add points, normalised to 0..1 from the image's displayed size. */
function addRegionPoint(click) {
  if (!studio.event) {
    setMessage("region-message", "Pick the event first: a region belongs to one event.", true);
    return;
  }
  const box = byId("frame-image").getBoundingClientRect();
  if (!box.width || !box.height) return;
  const norm = (value) => Math.round(Math.min(Math.max(value, 0), 1) * 10000) / 10000;
  const point = [norm((click.clientX - box.left) / box.width), norm((click.clientY - box.top) / box.height)];
  const last = studio.draft.at(-1);
  if (!last || last[0] !== point[0] || last[1] !== point[1]) studio.draft.push(point); // a double click: one point
  const more = MIN_REGION_POINTS - studio.draft.length;
  const next = more > 0 ? `click ${plural(more, "more point")} to close it` : 'Enter or "Close polygon" saves';
  setMessage("region-message", `${plural(studio.draft.length, "point")}: ${next}, Esc cancels.`);
  renderRegion();
  byId("stage").focus({ preventScroll: true });
}

const MIN_REGION_POINTS = 3; // a region is a polygon: the server refuses fewer points

async function closePolygon() {
  if (!studio.dataset || !studio.event || studio.draft.length < MIN_REGION_POINTS) return;
  const points = studio.draft.slice();
  await saveRegion(points, `Region saved (${points.length} points): only what happens inside it counts.`);
}

function cancelPolygon() {
  if (!studio.draft.length) return;
  studio.draft = [];
  setMessage("region-message", "");
  renderRegion();
}

async function clearRegion() {
  if (!studio.dataset || !studio.event) return;
  studio.draft = [];
  await saveRegion(null, "Region cleared: the whole frame counts.");
}

async function saveRegion(polygon, done) {
  const generation = studio.generation;
  const path = datasetPath(studio.dataset.name, `/regions/${encodeURIComponent(studio.event)}`);
  try {
    const dataset = await api(path, { method: "PUT", json: { polygon } });
    if (generation !== studio.generation) return;
    studio.draft = [];
    datasetAnswered(dataset);
    setMessage("region-message", done);
  } catch (err) {
    if (generation === studio.generation) setMessage("region-message", `Region not saved: ${err.message}`, true);
  }
  renderRegion();
}

function renderRegion() {
  const points = (list) => list.map(([x, y]) => `${x},${y}`).join(" ");
  const regions = (studio.dataset && studio.dataset.regions) || {};
  const saved = (studio.event && regions[studio.event]) || [];
  byId("region-saved").setAttribute("points", points(saved));
  byId("region-draft").setAttribute("points", points(studio.draft));
  // zero-length strokes with round caps: round dots whatever the image's aspect ratio
  byId("region-points").setAttribute("d", studio.draft.map(([x, y]) => `M${x} ${y}h0`).join(""));
  byId("region-clear").disabled = !saved.length;
  byId("region-close").disabled = studio.draft.length < MIN_REGION_POINTS;
  byId("region-cancel").disabled = !studio.draft.length;
}

// ------------------------------------------------------------------------------------------------ export

/** labels.csv needs the token: fetched, then saved through a blob URL. */
async function downloadLabels() {
  if (!studio.dataset) return;
  const name = studio.dataset.name;
  setMessage("export-message", "Saving the last labels, then downloading…");
  try {
    await labelsSaved();
    const blob = await api(datasetPath(name, "/labels.csv"), { as: "blob" });
    const url = URL.createObjectURL(blob);
    const link = el("a", { href: url, download: `${name}-labels.csv`, hidden: "" });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
    setMessage("export-message", `Downloaded ${name}-labels.csv.`);
  } catch (err) {
    setMessage("export-message", `No download: ${err.message}`, true);
  }
}

// -------------------------------------------------------------------------------- training and deployment

const training = {
  job: null, // the TrainingJobOut shown
  previous: null, // the done job of the same filter before it, whose estimate it is compared with
  timer: null,
};

async function trainFilter(event) {
  event.preventDefault();
  if (!studio.dataset || !studio.event) {
    setMessage("train-message", "Open a dataset and an event first.", true);
    return;
  }
  const form = event.currentTarget;
  const body = {
    dataset: studio.dataset.name,
    event: studio.event,
    filter: form.elements.filter.value.trim(),
    options: trainingOptions(form),
  };
  const generation = studio.generation;
  await submitting(form, "train-message", "Saving the last labels, then queueing the job…", async () => {
    await labelsSaved();
    const job = await api("/api/training-jobs", { method: "POST", json: body });
    if (generation === studio.generation) {
      training.previous = null;
      showTrainingJob(job);
      showRevisions(job.filter);
    }
    return `Queued job ${job.id}: a trainer takes it next.`;
  });
}

/** TrainingOptions from the form: only what was set (the rest: the trainer's defaults). */
function trainingOptions(form) {
  const options = {};
  if (form.elements.arch.value) options.arch = form.elements.arch.value;
  if (form.elements.steps.value.trim()) options.steps = Number(form.elements.steps.value);
  return options;
}

/** The MC kinds the cloud accepts, as the filter form has them (read from the API schema by app.js). */
function fillTrainingKinds() {
  const select = byId("train-arch");
  if (select.options.length > 1) return;
  const kinds = [...byId("f-architecture").options].map((option) => option.value);
  select.append(...kinds.map((kind) => el("option", { value: kind }, kind)));
}

/** The newest job of the open dataset and event, if any (nothing when the cloud has no training service). */
async function showLatestTrainingJob(generation) {
  let jobs;
  try {
    const query = new URLSearchParams({ dataset: studio.dataset.name, event: studio.event });
    jobs = await api(`/api/training-jobs?${query}`);
  } catch {
    return;
  }
  if (generation !== studio.generation || !Array.isArray(jobs)) return;
  const mine = jobs.filter((job) => job.dataset === studio.dataset.name && job.event === studio.event);
  if (!mine.length) return;
  const newest = mine.reduce((latest, job) => (job.id > latest.id ? job : latest));
  const before = mine.filter((job) => job.filter === newest.filter && job.status === "done" && job.id < newest.id);
  training.previous = before.length ? before.reduce((latest, job) => (job.id > latest.id ? job : latest)) : null;
  showTrainingJob(newest);
  showRevisions(newest.filter);
}

function showTrainingJob(job) {
  training.job = job;
  byId("training").replaceChildren(...trainingView(job));
  stopTrainingPoll();
  if (job.status === "queued" || job.status === "running") {
    training.timer = setTimeout(pollTrainingJob, TRAINING_POLL_MS);
  }
}

function stopTrainingPoll() {
  clearTimeout(training.timer);
  training.timer = null;
}

async function pollTrainingJob() {
  const shown = training.job;
  const generation = studio.generation;
  try {
    const job = await api(`/api/training-jobs/${shown.id}`);
    if (generation !== studio.generation || training.job !== shown) return;
    clearError("train-message");
    showTrainingJob(job);
  } catch (err) {
    if (generation !== studio.generation || training.job !== shown) return;
    setMessage("train-message", `Could not read job ${shown.id}: ${err.message}`, true);
    training.timer = setTimeout(pollTrainingJob, TRAINING_POLL_MS * 2);
  }
}

function trainingView(job) {
  const progress = job.progress || {};
  const fraction = job.status === "done" ? 1 : Number(progress.fraction) || 0;
  const failed = job.status === "failed";
  // A failed job's progress is where its trainer last was: said as such, its message (of work going on) left out.
  const stage = failed
    ? `failed${progress.stage ? ` in ${progress.stage}` : ""}`
    : job.status === "queued" && !progress.stage
      ? "waiting for a trainer"
      : progress.stage || job.status;
  const parts = [
    el(
      "h3",
      {},
      `Job ${job.id}: ${job.filter || "?"} `,
      el("span", { class: `badge job-${job.status}`, "data-testid": "job-status" }, job.status),
    ),
    el(
      "div",
      { class: "job-progress" },
      el("progress", { max: "1", value: String(fraction), "data-testid": "job-progress" }),
      el("span", { "data-testid": "job-stage" }, `${stage} ${Math.round(fraction * 100)}%`),
    ),
  ];
  if (progress.message && !failed) parts.push(el("p", { class: "muted" }, progress.message));
  if (failed) {
    parts.push(el("p", { class: "message error", "data-testid": "job-error" }, job.error || "failed"));
  }
  if (job.status === "queued" || job.status === "running") parts.push(cancelView(job));
  if (job.status === "done") parts.push(...resultView(job));
  return parts;
}

/** Cancel, for a job queued by mistake (a huge input size, a slow kind): it ends as failed, "cancelled". */
function cancelView(job) {
  const button = el("button", { type: "button", class: "secondary small", "data-testid": "job-cancel" }, "Cancel job");
  const message = el("p", { class: "message", role: "status", "data-testid": "cancel-message" });
  button.addEventListener("click", async () => {
    const running = job.status === "running" ? " Its trainer stops within seconds." : "";
    if (!confirm(`Cancel job ${job.id}?${running}`)) return;
    button.disabled = true;
    try {
      const cancelled = await api(`/api/training-jobs/${job.id}/cancel`, { method: "POST" });
      if (training.job && training.job.id === job.id) showTrainingJob(cancelled);
    } catch (err) {
      button.disabled = false;
      message.className = "message error";
      message.textContent = `Not cancelled: ${err.message}`;
    }
  });
  return el("div", { class: "form-actions" }, button, message);
}

const f1 = (value) => (typeof value === "number" ? value.toFixed(2) : "–");
const LABELS_CHANGED = "The event's labels or region changed after this job read them: its model lacks those changes.";
const RETRAIN = "Train a new revision to use them.";
const jobValidation = (job) => (job.result && job.result.validation) || (job.spec && job.spec.validation) || null;

/** The trainer's report: the estimate with its spread (beside the previous revision's), the warnings, the example
 * frames, the frames to label next, and Deploy. */
function resultView(job) {
  const report = job.result || {};
  const validation = jobValidation(job);
  const estimate = validation
    ? `Expected event F1 on new footage: ${f1(validation.event_f1)} ` +
      `(${f1(validation.f1_min)}–${f1(validation.f1_max)} over ${validation.folds} folds), ` +
      `precision ${f1(validation.precision)}, recall ${f1(validation.event_recall)}`
    : "No estimate: too few occurrences to hold any out. Label more of the event.";
  const details = [
    report.architecture && `${report.architecture} on ${report.tap}`,
    Array.isArray(report.input_size) && `${report.input_size[0]}×${report.input_size[1]}`,
    typeof report.positives === "number" && `${report.positives} event / ${report.negatives} not frames`,
    typeof report.training_f1 === "number" && `F1 on its own training frames ${f1(report.training_f1)}`,
  ].filter(Boolean);
  const warnings = [...new Set([...(report.warnings || []), ...((validation && validation.warnings) || [])])];
  return [
    el("p", { class: "estimate", "data-testid": "job-estimate" }, estimate),
    details.length ? el("p", { class: "muted" }, details.join(" · ")) : null,
    job.labels_changed
      ? el("p", { class: "message error", "data-testid": "job-labels-changed" }, `${LABELS_CHANGED} ${RETRAIN}`)
      : null,
    warnings.length
      ? el("ul", { class: "warnings", "data-testid": "job-warnings" }, ...warnings.map((w) => el("li", {}, `⚠ ${w}`)))
      : null,
    compareView(training.previous, job),
    ...examplesView(report.examples),
    improveView(job),
    deployView(job),
  ].filter(Boolean);
}

/** The previous revision's estimate and this one's side by side. */
function compareView(before, after) {
  if (!before || before.id === after.id || before.status !== "done") return null;
  const estimate = (v) => v && `${f1(v.event_f1)} (${f1(v.f1_min)}–${f1(v.f1_max)})`;
  const frames = (job) => job.result && `${job.result.positives} event / ${job.result.negatives} not`;
  const rows = [
    ["f1", "Expected event F1", (job) => estimate(jobValidation(job))],
    ["precision", "Precision", (job) => jobValidation(job) && f1(jobValidation(job).precision)],
    ["recall", "Recall", (job) => jobValidation(job) && f1(jobValidation(job).event_recall)],
    ["frames", "Labelled frames", frames],
  ];
  const heads = [before, after].map((job) => el("th", { scope: "col" }, `Job ${job.id}`));
  return el(
    "table",
    { class: "compare", "data-testid": "compare" },
    el("thead", {}, el("tr", {}, el("td", {}), ...heads)),
    el(
      "tbody",
      {},
      ...rows.map(([key, label, text]) =>
        el(
          "tr",
          { "data-field": key },
          el("th", { scope: "row" }, label),
          ...[before, after].map((job) => el("td", {}, text(job) || "–")),
        ),
      ),
    ),
  );
}

/** Improve: the unlabelled frames the filter is least sure about, to label next, and a new revision trained on them. */
function improveView(job) {
  const unlabelled = proposedFrames(job);
  const smoothing = job.spec && job.spec.smoothing;
  const closest = smoothing ? ` (scores closest to its threshold ${smoothing.threshold})` : "";
  const attrs = { type: "button", class: "secondary", "data-testid": "train-revision" };
  const button = el("button", attrs, "Train new revision");
  button.addEventListener("click", () => trainRevision(job, button));
  return el(
    "div",
    { class: "improve", "data-testid": "improve", "data-frames": unlabelled.map((e) => e.frame).join() },
    el("h4", {}, "Improve"),
    el(
      "p",
      { class: "muted" },
      unlabelled.length
        ? `Label these next: the frames this filter is least sure about${closest}; click one to label it.`
        : "No unlabelled frame to propose: mark events in the gallery, or label more footage.",
    ),
    el("div", { class: "example-row", "data-testid": "uncertain-frames" }, ...unlabelled.map(exampleThumb)),
    el("div", { class: "form-actions" }, button),
  );
}

/** The job's proposed frames that have no label yet, least sure first. */
function proposedFrames(job) {
  const proposed = (job.result && job.result.uncertain) || [];
  return proposed.filter((example) => !studio.labels.has(example.frame)).slice(0, UNCERTAIN_SHOWN);
}

/** "Improve" again once labels changed: a frame just labelled is proposed no more (one unlabelled is again). */
function refreshImprove() {
  const box = byId("training").querySelector('[data-testid="improve"]');
  if (!box || !training.job) return;
  if (proposedFrames(training.job).map((e) => e.frame).join() === box.dataset.frames) return;
  box.replaceWith(improveView(training.job));
}

/** A new job for the same filter, dataset, event and options, on the labels as they are now. */
async function trainRevision(job, button) {
  const generation = studio.generation;
  const body = { dataset: job.dataset, event: job.event, filter: job.filter, options: job.options };
  button.disabled = true;
  setMessage("train-message", "Saving the last labels, then queueing a new revision…");
  try {
    await labelsSaved();
    const next = await api("/api/training-jobs", { method: "POST", json: body });
    setMessage("train-message", `Queued job ${next.id}, a new revision of ${job.filter}: a trainer takes it next.`);
    if (generation !== studio.generation) return;
    training.previous = job;
    showTrainingJob(next);
  } catch (err) {
    setMessage("train-message", `Not done: ${err.message}`, true);
    button.disabled = false;
  }
}

const EXAMPLE_KINDS = [
  ["hits", "Hits", "fired on the event"],
  ["false_alarms", "False alarms", "fired without the event"],
  ["misses", "Misses", "missed the event"],
];

function examplesView(examples) {
  if (!examples) return [];
  const counts = examples.counts || {};
  const note =
    examples.source === "training frames"
      ? "scored by the filter on its own training frames (optimistic)"
      : "scored by models trained without them";
  const groups = EXAMPLE_KINDS.map(([key, title, what]) => {
    const frames = (examples[key] || []).slice(0, EXAMPLES_SHOWN);
    const total = typeof counts[key] === "number" ? counts[key] : frames.length;
    return el(
      "div",
      { class: "examples", "data-testid": `examples-${key}` },
      el("h4", { title: what }, `${title} (${fmt.count(total)})`),
      examplesShown(frames.length, total),
      el(
        "div",
        { class: "example-row" },
        ...(frames.length ? frames.map(exampleThumb) : [el("span", { class: "muted" }, "none")]),
      ),
    );
  });
  return [el("p", { class: "muted" }, `Example frames, ${note}; click one to label it.`), ...groups];
}

/** Why the heading counts more frames than the row shows: a report names one frame of a few runs of consecutive frames
 * (trainer/report.py), not every frame of the kind; null when every one is shown. */
function examplesShown(shown, total) {
  if (shown >= total) return null;
  const text = `${fmt.count(shown)} of ${fmt.count(total)} shown, one frame per run of consecutive frames`;
  return el("p", { class: "muted examples-shown", "data-testid": "examples-shown" }, text);
}

function exampleThumb(example) {
  const img = el("img", { alt: `frame ${example.frame}` });
  const score = typeof example.score === "number" ? ` · ${example.score.toFixed(2)}` : "";
  const button = el(
    "button",
    { type: "button", class: "example", "data-frame": example.frame, title: `frame ${example.frame}${score}` },
    img,
    el("span", {}, `${example.frame}${score}`),
  );
  button.addEventListener("click", () => {
    moveTo(example.frame, false);
    byId("stage").focus({ preventScroll: false });
  });
  if (studio.dataset && example.frame < frameTotal()) showImage(img, example.frame);
  return button;
}

function deployView(job) {
  const label = job.deployed ? "Deploy again" : "Deploy";
  const button = el("button", { type: "button", "data-testid": "job-deploy" }, label);
  const message = el("p", { class: "message", role: "status", "data-testid": "deploy-message" });
  if (job.deployed) [message.dataset.state, message.textContent] = deployedState(job);
  button.addEventListener("click", () => deployJob(job, button, message));
  return el("div", { class: "form-actions" }, button, message);
}

/** A deployed job as the revisions last read say: [state, what it is now] (the filter's model, a revision it was
 * rolled back from, or one of a filter deleted since). */
function deployedState(job) {
  const known = revisionsOf.filter === job.filter && revisionsOf.loaded;
  if (known && !revisionsOf.exists) return ["deleted", `Filter ${job.filter} was deleted: Deploy again registers it.`];
  if (known && revisionsOf.current !== job.id) {
    const runs = revisionsOf.current ? `job ${revisionsOf.current}` : "another model";
    return ["replaced", `Filter ${job.filter} runs ${runs} now: Deploy again puts this one back.`];
  }
  return ["current", `Deployed as filter ${job.filter}: see Filters above.`];
}

/** The training panel's deploy line after a rollback, a deletion or a deployment elsewhere (left alone when its state
 * did not change, so the answer of a deployment made here stays). */
function refreshDeployState() {
  const message = byId("training").querySelector('[data-testid="deploy-message"]');
  if (!message || !training.job || !training.job.deployed) return;
  const [state, text] = deployedState(training.job);
  if (state === message.dataset.state) return;
  message.className = "message";
  [message.dataset.state, message.textContent] = [state, text];
}

// A deployment this much below the running model's estimate asks first (seeds and labels move estimates a little).
const ESTIMATE_DROP = 0.1;

/** Why putting `job` in place of the filter running now needs a yes: it filters for another event, or its estimate
 * is far below the running model's; "" when it needs none (or no filter of that name runs). */
async function deployWarning(job) {
  let running;
  try {
    running = (await api(`/api/filters/${encodeURIComponent(job.filter)}`)).spec;
  } catch (err) {
    if (err.status === 404) return "";
    throw err;
  }
  if (running.event && job.event && running.event !== job.event) {
    return `Filter ${job.filter} filters for event "${running.event}"; this job learned "${job.event}". Replace it?`;
  }
  const now = running.validation && running.validation.event_f1;
  const next = jobValidation(job) && jobValidation(job).event_f1;
  if (typeof now === "number" && typeof next === "number" && next < now - ESTIMATE_DROP) {
    return `This job's estimate (event F1 ${f1(next)}) is far below the running model's (${f1(now)}). Deploy it anyway?`;
  }
  return "";
}

/** Whether the labels `job` learned from changed since (read again: they may have changed after it was shown). */
async function labelsChanged(job) {
  return (await api(`/api/training-jobs/${job.id}`)).labels_changed === true;
}

async function deployJob(job, button, message) {
  button.disabled = true;
  message.className = "message";
  message.textContent = "Deploying…";
  try {
    const warning = await deployWarning(job);
    if (warning && !confirm(warning)) {
      message.textContent = `Not deployed: filter ${job.filter} keeps the model it runs.`;
      return;
    }
    if ((await labelsChanged(job)) && !confirm(`${LABELS_CHANGED} Deploy it anyway?`)) {
      message.textContent = `Not deployed. ${RETRAIN}`;
      return;
    }
    const answer = await api(`/api/training-jobs/${job.id}/deploy`, { method: "POST" });
    const revision = answer && typeof answer.revision === "number" ? ` (revision ${answer.revision})` : "";
    job.deployed = true;
    const refused = (answer && answer.refused_by) || [];
    message.className = refused.length ? "message error" : "message ok";
    message.dataset.state = "current";
    message.textContent = refused.length
      ? `Deployed as filter ${job.filter}${revision}, but ${refusers(refused)} refuse it: they run another base ` +
        "model or input size than it was trained on, and go on with what they ran before."
      : `Deployed as filter ${job.filter}${revision}: the edges take it within seconds.`;
    filtersSignature = "";
    showRevisions(job.filter);
    await refreshFilters();
  } catch (err) {
    message.className = "message error";
    message.textContent = `Not deployed: ${err.message}`;
  } finally {
    button.disabled = false;
  }
}

// -------------------------------------------------------------------------------------------------- revisions

const revisionsOf = {
  filter: "", // the filter whose revisions are shown ("" for none)
  loaded: false, // exists and current are known
  exists: true, // it is registered now (false: deleted since it was deployed)
  current: null, // the job it runs now, when one of its revisions
  asked: 0, // bumped per read: only the latest answer is shown
};

/** Whether the filter is registered now (a deleted filter keeps its revisions). */
async function filterExists(name) {
  try {
    await api(`/api/filters/${encodeURIComponent(name)}`);
    return true;
  } catch (err) {
    if (err.status === 404) return false;
    throw err;
  }
}

/** The filter's revisions (its deployed jobs, newest first), each but the current one with "Roll back to this". */
async function showRevisions(filter) {
  const generation = studio.generation;
  const asked = ++revisionsOf.asked;
  if (revisionsOf.filter !== filter) Object.assign(revisionsOf, { filter, loaded: false });
  let answer = null;
  try {
    answer = await Promise.all([api(`/api/filters/${encodeURIComponent(filter)}/revisions`), filterExists(filter)]);
  } catch {
    // not readable now (the server is down): none shown, read again at the next change of the filters
  }
  if (generation !== studio.generation || asked !== revisionsOf.asked) return;
  const [revisions, exists] = answer || [[], true];
  if (answer) clearError("revisions-message");
  const current = revisions.find((revision) => revision.current);
  Object.assign(revisionsOf, { loaded: true, exists, current: current ? current.job : null });
  refreshDeployState();
  const box = byId("revisions");
  if (!revisions.length) {
    box.replaceChildren();
    return;
  }
  const gone = `${filter} was deleted: rolling back to a revision asks first, then registers it again.`;
  const deleted = exists ? null : el("p", { class: "muted", "data-testid": "revisions-deleted" }, gone);
  box.replaceChildren(
    ...[
      el("h3", {}, `Revisions of ${filter}`),
      deleted,
      el("ol", { class: "revision-list" }, ...revisions.map((revision) => revisionItem(filter, revision))),
    ].filter(Boolean), // replaceChildren would show a null as the text "null"
  );
}

/** The filter list changed (app.js: a deletion, or a deployment from elsewhere): the revisions shown are read again. */
function refreshRevisions() {
  if (revisionsOf.filter && studio.dataset) showRevisions(revisionsOf.filter);
}

function revisionItem(filter, revision) {
  const v = revision.validation;
  const estimate = v ? `F1 ${f1(v.event_f1)} (${f1(v.f1_min)}–${f1(v.f1_max)})` : "no estimate";
  const frames = ` · ${revision.positives} event / ${revision.negatives} not`;
  let action;
  if (revision.current) {
    action = el("span", { class: "badge job-done", "data-testid": "revision-current" }, "current");
  } else {
    const attrs = { type: "button", class: "secondary small", "data-testid": "revision-rollback" };
    action = el("button", attrs, "Roll back to this");
    action.addEventListener("click", () => rollBack(filter, revision, action));
  }
  const title = `trained on ${revision.dataset ?? "a deleted dataset"} / ${revision.event}`;
  return el(
    "li",
    { "data-testid": "revision", "data-job": revision.job, title },
    `Job ${revision.job} · ${estimate}${frames} · ${fmt.time(revision.finished_at)} `,
    action,
  );
}

async function rollBack(filter, revision, button) {
  button.disabled = true;
  try {
    // Deploying a job of a deleted filter registers it again. A deletion is deliberate, so a rollback never undoes
    // it silently; but getting back a filter deleted by mistake is a fair wish the page offers no other way to, so
    // the page asks rather than refuses. Asked here, not from the list: it may have been deleted since it was read.
    const restore = `Filter ${filter} was deleted. Register it again with job ${revision.job}'s model?`;
    if (!(await filterExists(filter)) && !confirm(restore)) {
      setMessage("revisions-message", `Not rolled back: ${filter} was deleted and stays deleted.`);
      button.disabled = false;
      return;
    }
    setMessage("revisions-message", `Putting job ${revision.job}'s model back…`);
    await api(`/api/training-jobs/${revision.job}/deploy`, { method: "POST" });
    setMessage("revisions-message", `Rolled ${filter} back to job ${revision.job}: the edges take it within seconds.`);
    filtersSignature = "";
    await Promise.all([showRevisions(filter), refreshFilters()]);
  } catch (err) {
    setMessage("revisions-message", `Not rolled back: ${err.message}`, true);
    button.disabled = false;
  }
}

// ------------------------------------------------------------------------------------------------ wiring

SECTIONS.push(["datasets-status", refreshDatasets]); // polled with the rest of the page (app.js)

function initStudio() {
  studioLink = readStudioLink();
  window.addEventListener("hashchange", followStudioLink);
  byId("footage-details").addEventListener("toggle", (event) => {
    if (event.currentTarget.open) loadFootageChoices();
  });
  byId("fo-edge").addEventListener("change", fillFootageCameras);
  byId("footage-form").addEventListener("submit", requestFootage);
  byId("upload-form").addEventListener("submit", uploadClip);
  byId("studio-event-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = byId("studio-event");
    if (!input.reportValidity()) return;
    focusWhenLoaded(chooseEvent(input.value.trim()), byId("stage"));
  });
  byId("studio-close").addEventListener("click", closeStudio);
  byId("stage").addEventListener("click", addRegionPoint);
  for (const button of document.querySelectorAll(".studio-side [data-label], .studio-side [data-move]")) {
    button.addEventListener("click", onLabelButton);
  }
  byId("region-close").addEventListener("click", closePolygon);
  byId("region-cancel").addEventListener("click", cancelPolygon);
  byId("region-clear").addEventListener("click", clearRegion);
  byId("labels-csv").addEventListener("click", downloadLabels);
  byId("train-form").addEventListener("submit", trainFilter);
  document.addEventListener("dataset-changed", (event) => feedbackGiven(event.detail));
  document.addEventListener("signed-out", clearStudioViews);
  document.addEventListener("token-saved", tokenSaved);
  document.addEventListener("filters-changed", refreshRevisions);
  document.addEventListener("keydown", onStudioKey);
  window.addEventListener("beforeunload", (event) => {
    if (!outbox.batches.length) return;
    flushLabels();
    event.preventDefault(); // the browser asks before leaving with labels not saved yet
  });
}

document.addEventListener("DOMContentLoaded", initStudio);
