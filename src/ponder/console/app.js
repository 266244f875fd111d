// The ponder web console: plain JavaScript, no build step, nothing loaded from elsewhere.
//
// It uses the public API like any client: /v1/overview, /v1/tasks and the task's event
// stream, read with fetch() so that an API key travels in the Authorization header (an
// EventSource could only put it in the URL). With API keys on, the key lives in this
// tab's sessionStorage.
"use strict";

const KEY_STORAGE = "ponder-api-key";
const OVERVIEW_EVERY_MS = 2000;
const LIST_EVERY_MS = 3000;
const PAGE_SIZE = 20;
const MAX_RECONNECTS = 8;

const state = { auth: false, view: null, keyPromise: null };

// The service's names, from /console/config.json before anything is shown (no copy here):
// every task status, the terminal ones, the events that carry a task's status, the
// statuses of a finished sample, the event kinds, the modes and task types (with their
// defaults).
const names = {
  statuses: [], terminal: [], statusEvents: [], finishedSamples: [], events: {},
  modes: [], defaultMode: "", taskTypes: [], defaultTaskType: "",
};
const isTerminal = (status) => names.terminal.includes(status);

// --- small helpers ------------------------------------------------------------------
const $ = (selector) => document.querySelector(selector);

/** An element with properties (class, text, dataset, on…, attributes) and children. */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "text") el.textContent = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) {
      el.append(child instanceof Node ? child : String(child));
    }
  }
  return el;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    if (signal) signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); });
  });
}

/** Run fn now and then every ms until the returned stop() is called. */
function every(ms, fn, onError) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await fn();
    } catch (error) {
      if (!stopped && onError) onError(error);
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}

function fmtTime(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  const sameDay = date.toDateString() === new Date().toDateString();
  const time = date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  return sameDay ? time : `${date.toLocaleDateString()} ${time}`;
}

function fmtSeconds(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

function between(from, to) {
  return from && to ? new Date(to) - new Date(from) : null;
}

function percent(x) {
  return x === null || x === undefined ? "—" : `${Math.round(x * 100)} %`;
}

function badge(status) {
  return h("span", { class: `badge s-${status}`, dataset: { status } }, status.replace("_", " "));
}

function field(label, control, hint) {
  return h("label", { class: "field" }, h("span", { class: "label" }, label), control,
    hint ? h("span", { class: "hint" }, hint) : null);
}

function choice(id, values, selected) {
  return h("select", { id, name: id }, values.map((v) => h("option", { value: v, selected: v === selected }, v)));
}

// --- the API -------------------------------------------------------------------------
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** Ask for a key (one dialog for every caller waiting on it); resolves once given. */
function askKey(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  showKeyState();
  if (state.keyPromise) return state.keyPromise;
  const dialog = $("#key-dialog");
  const input = $("#key-input");
  const error = $("#key-error");
  error.textContent = message || "";
  error.hidden = !message;
  input.value = "";
  state.keyPromise = new Promise((resolve) => {
    $("#key-form").onsubmit = (event) => {
      event.preventDefault();
      const key = input.value.trim();
      if (!key) return;
      sessionStorage.setItem(KEY_STORAGE, key);
      dialog.close();
      state.keyPromise = null;
      showKeyState();
      resolve();
    };
  });
  dialog.showModal();
  input.focus();
  return state.keyPromise;
}

function showKeyState() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  $("#key-state").hidden = !(state.auth && key);
  $("#key-label").textContent = key ? `key …${key.slice(-4)}` : "";
}

/** A call to the API: the JSON answer, or ApiError with the envelope's message. */
async function api(method, path, body) {
  for (;;) {
    if (state.auth && !sessionStorage.getItem(KEY_STORAGE)) await askKey();
    const init = { method, headers: authHeaders(), cache: "no-store" };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (response.status === 401 && state.auth) {
      await askKey("That key was refused: enter a valid one.");
      continue;
    }
    const data = await response.json().catch(() => null);
    if (!response.ok) {
      const error = (data && data.error) || {};
      throw new ApiError(response.status, error.code || "error", error.message || response.statusText);
    }
    return data;
  }
}

/** Server-Sent Events from a fetch() body: {id, event, data} objects. */
async function* sseEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let id = "";
  let name = "message";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        let line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) yield { id, event: name, data: JSON.parse(data.join("\n")) };
          name = "message";
          data = [];
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const key = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? "" : line.slice(colon + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (key === "id") id = val;
          else if (key === "event") name = val;
          else if (key === "data") data.push(val);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** The event that carries a terminal status: the stream's last. */
function isFinal(event) {
  return names.statusEvents.includes(event.event) && isTerminal(event.data.status);
}

// --- routing -------------------------------------------------------------------------
function route() {
  if (state.view) state.view.stop();
  const main = $("#main");
  main.replaceChildren();
  const hash = location.hash || "#/";
  const match = hash.match(/^#\/tasks\/([^/]+)$/);
  if (match) {
    state.view = taskView(main, decodeURIComponent(match[1]));
  } else {
    state.view = homeView(main, hash === "#/new");
  }
}

// --- home: overview, submit form, task list ------------------------------------------
function homeView(main, focusForm) {
  const overview = h("section", { class: "card overview", id: "overview", "aria-label": "Overview" },
    h("h2", {}, "Overview"), h("p", { class: "muted" }, "Loading…"));
  const form = submitForm();
  const list = taskList();
  main.append(h("div", { class: "home" }, overview, form.el), list.el);
  const stops = [
    every(OVERVIEW_EVERY_MS, async () => renderOverview(overview, await api("GET", "/v1/overview")),
      (error) => showProblem(overview, error)),
    list.start(),
  ];
  if (focusForm) form.focus();
  return { stop: () => stops.forEach((stop) => stop()) };
}

function showProblem(el, error) {
  let note = el.querySelector(":scope > .problem");
  if (!note) {
    note = h("p", { class: "error problem" });
    el.append(note);
  }
  note.textContent = `Could not refresh: ${error.message}`;
}

function tile(title, figure, name, ...rest) {
  return h("div", { class: "tile" }, h("div", { class: "tile-title" }, title),
    h("div", { class: "figure", dataset: { figure: name } }, figure), ...rest);
}

function barRow(label, value, max, extraClass) {
  const bar = h("span", { class: `bar ${extraClass || ""}` });
  bar.style.width = `${max > 0 ? Math.max(value > 0 ? 3 : 0, (100 * value) / max) : 0}%`;
  return h("div", { class: "bar-row" }, h("span", { class: "bar-label" }, label),
    h("span", { class: "bar-track" }, bar), h("span", { class: "bar-value" }, String(value)));
}

function renderOverview(el, data) {
  const depths = data.queue.by_priority;
  const deepest = Math.max(1, ...Object.values(depths));
  const queue = tile("Queue (pending)", String(data.queue.pending), "pending",
    h("div", { class: "bars" }, Object.entries(depths).map(([p, n]) => barRow(`P${p}`, n, deepest, "b-queue"))));
  const running = tile("Tasks running", data.tasks_running === null ? "—" : String(data.tasks_running), "running",
    h("div", { class: "sub" }, `workers alive: ${data.workers}`));
  const tiles = [queue, running];
  if (data.engine) {
    const e = data.engine;
    const rows = [];
    for (const [label, key] of [["running", "rows_running"], ["prefilling", "rows_prefilling"], ["queued", "rows_queued"],
      ["requests in flight", "requests_in_flight"], ["requests queued", "requests_queued"]]) {
      if (e[key] !== undefined) rows.push(barRow(label, e[key], Math.max(1, e.max_rows || e.max_concurrency || 1), "b-engine"));
    }
    const engineTile = tile("Engine rows", String(e.rows_running ?? e.requests_in_flight ?? 0), "rows",
      h("div", { class: "sub" }, `${e.name} · ${e.model}`), h("div", { class: "bars" }, rows));
    if (e.process_state !== undefined) {
      // an engine with a process of its own: whether it is live, and why not
      const restarts = `${e.process_restarts} restart${e.process_restarts === 1 ? "" : "s"}`;
      const live = e.process_state === "live";
      engineTile.append(h("div", { class: live ? "sub" : "sub error", id: "engine-process", dataset: { state: e.process_state } },
        live ? `process ${e.process_pid} live · ${restarts}` : `process down: ${e.process_error} · ${restarts}`));
    }
    tiles.push(engineTile);
    tiles.push(tile("Tokens / s", data.tokens_per_s === null ? "—" : data.tokens_per_s.toFixed(1), "tokens",
      h("div", { class: "sub" }, `${e.tokens ?? "—"} tokens generated`)));
  }
  if (Array.isArray(data.models) && data.models.length) tiles.push(modelsTile(data.models));
  if (data.finished) tiles.push(finishedTile(data.finished));
  const head = h("div", { class: "card-head" }, h("h2", {}, "Overview"),
    h("span", { class: "muted small" }, `${data.role} · updated ${fmtTime(data.time)}`));
  el.replaceChildren(head, h("div", { class: "tiles" }, tiles));
  if (data.note) el.append(h("p", { class: "note", id: "overview-note" }, data.note));
  el.dataset.loaded = "true";
}

/** The models the live workers serve: each one's state, resident memory and workers. */
function modelsTile(models) {
  const rows = models.map((m) => {
    const state = typeof m.state === "string" ? m.state : "none";
    const mb = typeof m.resident_mb === "number" ? `${m.resident_mb.toFixed(0)} MB` : "—";
    const workers = Array.isArray(m.workers) ? m.workers.length : (typeof m.workers === "number" ? m.workers : null);
    const pending = m.queue && typeof m.queue.pending === "number" ? m.queue.pending : null;
    return h("tr", { dataset: { model: String(m.model), state } },
      h("td", { class: "mono" }, String(m.model)),
      h("td", {}, h("span", { class: `badge m-${state}` }, m.state ? state : "not served")),
      h("td", { class: "num" }, mb),
      h("td", { class: "num" }, workers === null ? "—" : `${workers} worker${workers === 1 ? "" : "s"}`),
      h("td", { class: "num" }, pending === null ? "—" : `${pending} pending`));
  });
  return h("div", { class: "tile wide", id: "models-panel" }, h("div", { class: "tile-title" }, "Models"),
    h("table", { class: "models-table" }, h("tbody", {}, rows)));
}

function finishedTile(finished) {
  const buckets = finished.recent;
  // the ends the overview counts (a service older than a status leaves it out)
  const ended = names.terminal.filter((s) => finished.total[s] !== undefined);
  const most = Math.max(1, ...buckets.map((b) => ended.reduce((sum, s) => sum + (b[s] || 0), 0)));
  const columns = buckets.map((b) => {
    const total = ended.reduce((sum, s) => sum + (b[s] || 0), 0);
    const column = h("div", { class: "col", title: `${fmtTime(b.start)}: ` + ended.map((s) => `${s} ${b[s]}`).join(", ") });
    for (const status of ended) {
      if (!b[status]) continue;
      const part = h("span", { class: `seg s-${status}` });
      part.style.height = `${(100 * b[status]) / most}%`;
      column.append(part);
    }
    column.dataset.total = String(total);
    return column;
  });
  const totals = ended.map((s) => h("span", { class: `chip s-${s}`, dataset: { status: s } }, `${s.replace("_", " ")} ${finished.total[s]}`));
  return h("div", { class: "tile wide" }, h("div", { class: "tile-title" }, "Tasks finished"),
    h("div", { class: "chips" }, totals),
    h("div", { class: "minutes", "aria-label": "finished per minute" }, columns),
    h("div", { class: "sub" }, `per minute, last ${buckets.length} min (watched since ${fmtTime(finished.since)})`));
}

function submitForm() {
  const prompt = h("textarea", { id: "f-prompt", name: "prompt", rows: 4, required: true, placeholder: "What is 17 * 24?" });
  const mode = choice("f-mode", names.modes, names.defaultMode);
  const priority = choice("f-priority", ["0", "1", "2", "3", "4", "5"], "3");
  const type = choice("f-type", names.taskTypes, names.defaultTaskType);
  const samples = h("input", { id: "f-samples", name: "samples", type: "number", min: 1, max: 12, placeholder: "mode's" });
  const error = h("p", { class: "error", id: "f-error", hidden: true });
  const button = h("button", { type: "submit", class: "primary", id: "f-submit" }, "Submit");
  const form = h("form", { class: "card submit", id: "submit-form" },
    h("h2", {}, "New task"), field("Prompt", prompt),
    h("div", { class: "fields" }, field("Mode", mode), field("Priority", priority, "0 is the most urgent"),
      field("Task type", type), field("Samples", samples)),
    error, h("div", { class: "actions" }, button));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    button.disabled = true;
    const body = { prompt: prompt.value, mode: mode.value, priority: Number(priority.value), task_type: type.value };
    if (samples.value) body.samples = Number(samples.value);
    try {
      const task = await api("POST", "/v1/tasks", body);
      location.hash = `#/tasks/${encodeURIComponent(task.id)}`;
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  return { el: form, focus: () => prompt.focus() };
}

function taskList() {
  let status = "";
  let cursors = [null]; // the cursor of each page seen
  let page = 0;
  let next = null;
  const filter = choice("status-filter", ["all", ...names.statuses], "all");
  filter.setAttribute("aria-label", "Filter by status");
  const body = h("tbody");
  const newer = h("button", { type: "button", id: "page-newer" }, "← Newer");
  const older = h("button", { type: "button", id: "page-older" }, "Older →");
  const where = h("span", { class: "muted small" });
  const error = h("p", { class: "error", hidden: true });
  const el = h("section", { class: "card tasks", id: "tasks" },
    h("div", { class: "card-head" }, h("h2", {}, "Tasks"), filter),
    h("div", { class: "table-wrap" }, h("table", {},
      h("thead", {}, h("tr", {}, ["Task", "Status", "Model", "Mode", "Created", "Samples", "Answer"].map((t) => h("th", {}, t)))),
      body)),
    error, h("div", { class: "pager" }, newer, where, older));

  async function load() {
    const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (status) params.set("status", status);
    if (cursors[page]) params.set("cursor", cursors[page]);
    const data = await api("GET", `/v1/tasks?${params}`);
    next = data.next_cursor;
    const rows = data.data.map(taskRow);
    body.replaceChildren(...(rows.length ? rows : [h("tr", {}, h("td", { colspan: 7, class: "muted" },
      status ? `No ${status.replace("_", " ")} tasks.` : "No tasks yet: submit one above."))]));
    newer.disabled = page === 0;
    older.disabled = !next;
    where.textContent = `page ${page + 1}`;
    error.hidden = true;
    el.dataset.loaded = "true";
  }
  const reload = () => load().catch(showError);
  const showError = (e) => { error.textContent = `Could not load the tasks: ${e.message}`; error.hidden = false; };
  filter.addEventListener("change", () => {
    status = filter.value === "all" ? "" : filter.value;
    cursors = [null];
    page = 0;
    reload();
  });
  newer.addEventListener("click", () => { if (page > 0) { page -= 1; reload(); } });
  older.addEventListener("click", () => {
    if (next) { cursors[page + 1] = next; page += 1; reload(); }
  });
  // the first page follows new tasks; older pages stay as they were read
  const start = () => every(LIST_EVERY_MS, () => (page === 0 ? load() : null), showError);
  return { el, start };
}

function taskRow(task) {
  const answer = task.result ? task.result.answer ?? "—" : "";
  return h("tr", { dataset: { task: task.id } },
    h("td", {}, h("a", { href: `#/tasks/${encodeURIComponent(task.id)}`, class: "mono" }, task.id)),
    h("td", {}, badge(task.status)), h("td", { class: "model-cell" }, task.model ?? "—"), h("td", {}, task.mode),
    h("td", { title: task.created_at }, fmtTime(task.created_at)),
    h("td", {}, `${task.samples_done}/${task.samples_planned}`),
    h("td", { class: "answer-cell" }, answer));
}

// --- one task ------------------------------------------------------------------------
function taskView(main, id) {
  const control = new AbortController();
  const path = `/v1/tasks/${encodeURIComponent(id)}`;
  const view = new TaskPage(main, path, control.signal);
  view.open().catch((error) => view.fail(error));
  return { stop: () => control.abort() };
}

class TaskPage {
  constructor(main, path, signal) {
    this.main = main;
    this.path = path;
    this.signal = signal;
    this.task = null;
    this.cards = new Map(); // sample index -> its card's parts
    this.texts = new Map(); // sample index -> text so far, from the deltas
    this.samples = new Map(); // sample index -> the finished sample
    this.main.append(h("p", { class: "muted" }, "Loading the task…"));
  }

  fail(error) {
    if (this.signal.aborted) return;
    const message = error instanceof ApiError && error.status === 404
      ? "No such task (or it belongs to another API key)."
      : `Could not load the task: ${error.message}`;
    this.main.replaceChildren(h("section", { class: "card", id: "task-error" },
      h("h2", {}, "Task"), h("p", { class: "error" }, message), h("p", {}, h("a", { href: "#/" }, "Back to the overview"))));
  }

  async open() {
    this.render(await api("GET", this.path));
    if (!isTerminal(this.task.status)) await this.follow();
    await this.watchDeliveries();
  }

  // --- the page --------------------------------------------------------------------
  render(task) {
    if (this.signal.aborted) return;
    this.task = task;
    for (const sample of task.samples) {
      if (sample.text !== null && names.finishedSamples.includes(sample.status)) this.samples.set(sample.index, sample);
    }
    this.cancel = h("button", { type: "button", class: "danger", id: "cancel" }, "Cancel task");
    this.cancel.addEventListener("click", () => this.cancelTask());
    this.status = h("span", { id: "task-status" });
    this.head = h("section", { class: "card task-head", id: "task" },
      h("div", { class: "title-row" }, h("h1", { class: "mono" }, task.id), this.status, this.cancel),
      h("p", { class: "meta" }, h("span", { class: "model", id: "task-model" }, task.model ?? "—"),
        ` · ${task.mode} mode · ${task.task_type} · priority ${task.priority} · ` +
        `${task.samples_planned} sample${task.samples_planned === 1 ? "" : "s"} planned` +
        (task.queue_timeout_s ? ` · queue timeout ${task.queue_timeout_s} s` : "")));
    this.answer = h("section", { class: "card answer", id: "answer" });
    this.votes = h("section", { class: "card votes", id: "votes" });
    this.sampleGrid = h("div", { class: "samples" });
    this.timings = h("section", { class: "card timings", id: "timings" });
    this.webhook = h("section", { class: "card webhook", id: "webhook" });
    this.problem = h("p", { class: "error", id: "task-problem", hidden: true });
    this.main.replaceChildren(this.head, this.problem,
      h("div", { class: "pair" }, this.promptCard(task), this.answer),
      this.votes,
      h("section", { class: "card", id: "samples" }, h("h2", {}, "Samples"), this.sampleGrid),
      h("div", { class: "pair" }, this.timings, this.webhook));
    this.cards.clear();
    for (const sample of task.samples) this.card(sample.index);
    for (const [index, sample] of this.samples) this.showSample(index, sample);
    for (const [index, text] of this.texts) if (!this.samples.has(index)) this.showText(index, text);
    this.update();
  }

  promptCard(task) {
    const body = task.messages
      ? task.messages.map((m) => h("div", { class: "message" }, h("span", { class: "role" }, m.role), h("pre", {}, m.content)))
      : [h("pre", { id: "prompt" }, task.prompt || "")];
    return h("section", { class: "card prompt" }, h("h2", {}, "Prompt"), body);
  }

  /** Everything that depends on the task record as a whole. */
  update() {
    const task = this.task;
    this.status.replaceChildren(badge(task.status));
    this.head.dataset.status = task.status;
    this.cancel.hidden = isTerminal(task.status);
    this.showAnswer();
    this.showVotes();
    this.showTimings();
    this.showWebhook();
  }

  showAnswer() {
    const task = this.task;
    const result = task.result;
    const parts = [h("h2", {}, result ? "Answer" : task.preliminary ? "Preliminary answer" : "Answer")];
    const shown = result || task.preliminary;
    if (shown) {
      const structured = Boolean(shown.fields);
      const final = { final: result ? "true" : "false" };
      parts.push(structured
        ? h("pre", { class: "json-answer", id: "answer-value", dataset: final },
          shown.object ? JSON.stringify(shown.object, null, 2) : "(no valid object)")
        : h("div", { class: "big-answer", id: "answer-value", dataset: final }, shown.answer ?? "(no extracted answer)"));
      parts.push(h("p", { class: "meta" }, `confidence ${percent(shown.confidence)} · agreement ${percent(shown.agreement)} · ` +
        `sample #${shown.chosen_sample}` + (structured ? " · the least sure required field" : "")));
      if (structured) parts.push(...this.fieldsTable(shown));
      if (result && task.preliminary) {
        parts.push(h("p", { class: "muted small" }, `preliminary answer was ${task.preliminary.answer ?? "(none)"}`));
      }
      if (shown.stage !== null && shown.stage !== undefined) {  // auto mode: where the cascade is
        const taken = shown.escalations.length ? `escalated: ${shown.escalations.join(", ")}` : "no escalation";
        parts.push(h("p", { class: "meta", id: "answer-stage" }, `stage ${shown.stage} of 3 · ${taken}` +
          (shown.stop_reason ? ` · stopped: ${shown.stop_reason}` : "")));
      }
      if (!result) parts.push(h("p", { class: "muted small" }, "the vote is still open"));
      if (shown.clarification) {
        parts.push(h("div", { class: "clarification", id: "clarification" }, h("strong", {}, "Clarification: "), shown.clarification));
      }
    } else if (task.status === "expired") {
      parts.push(h("p", { class: "muted", id: "expired-note" },
        `Not started within its queue timeout (${task.queue_timeout_s ?? "?"} s): it never ran.`));
    } else if (!isTerminal(task.status)) {
      parts.push(h("p", { class: "muted" }, task.status === "pending" ? "Waiting for a worker…" : "The samples are being written…"));
    }
    if (task.error) parts.push(h("p", { class: "error", id: "task-error-detail" }, `${task.error.code}: ${task.error.message}`));
    this.answer.replaceChildren(...parts);
    this.answer.dataset.answer = result ? String(result.answer) : "";
  }

  /** A structured answer's fields, one row each: path, value, confidence, votes. */
  fieldsTable(shown) {
    const rows = Object.entries(shown.fields).map(([path, vote]) => {
      const absent = vote.value === null && "(absent)" in vote.votes && !("null" in vote.votes);
      const value = absent ? "(absent)" : JSON.stringify(vote.value);
      const votes = Object.entries(vote.votes).map(([label, count]) => `${label} (${count})`).join(" · ");
      const meter = h("span", { class: "bar" });
      meter.style.width = `${Math.round(100 * vote.confidence)}%`;
      return h("tr", { class: vote.confidence < 0.5 ? "unsure" : null, dataset: { path, value, confidence: String(vote.confidence) } },
        h("td", { class: "mono" }, path),
        h("td", { class: "mono field-value" }, value),
        h("td", { class: "field-confidence" }, h("span", { class: "bar-track" }, meter), percent(vote.confidence)),
        h("td", { class: "field-votes", title: `agreement ${percent(vote.agreement)}` }, votes));
    });
    const note = shown.object_from === "sample"
      ? h("p", { class: "note", id: "object-from" }, `The fields voted one by one did not make a valid object: ` +
        `this is sample #${shown.chosen_sample} whole, and its fields' votes.`)
      : null;
    return [note, h("div", { class: "table-wrap" }, h("table", { id: "fields", class: "fields-table" },
      h("thead", {}, h("tr", {}, ["Field", "Value", "Confidence", "Votes"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No field."))))),
    ].filter(Boolean);
  }

  showVotes() {
    const result = this.task.result;
    let tally = {};
    if (result) {
      tally = result.votes;
    } else {
      for (const sample of this.samples.values()) {
        if (sample.status === "done" && sample.answer !== null) tally[sample.answer] = (tally[sample.answer] || 0) + 1;
      }
    }
    const entries = Object.entries(tally).sort((a, b) => b[1] - a[1]);
    const most = Math.max(1, ...entries.map(([, n]) => n));
    const bars = entries.map(([answer, count]) => {
      const row = barRow(answer, count, most, result && answer === String(result.answer) ? "b-winner" : "b-vote");
      row.classList.add("vote");
      row.dataset.answer = answer;
      row.dataset.count = String(count);
      return row;
    });
    this.votes.replaceChildren(h("h2", {}, result ? "Vote" : "Vote so far"),
      bars.length ? h("div", { class: "bars" }, bars) : h("p", { class: "muted" }, "No finished sample yet."));
    this.votes.dataset.final = result ? "true" : "false";
  }

  showTimings() {
    const task = this.task;
    const rows = [
      ["created", fmtTime(task.created_at)],
      ["started", fmtTime(task.started_at)],
      ["finished", fmtTime(task.finished_at)],
      ["waited in the queue", fmtSeconds(between(task.created_at, task.started_at))],
      ["ran", fmtSeconds(between(task.started_at, task.finished_at))],
      ["samples", `${task.samples_done} done, ${task.samples_used} used of ${task.samples_planned}`],
      ["tokens", `${task.usage.prompt_tokens} prompt · ${task.usage.completion_tokens} completion`],
    ];
    this.timings.replaceChildren(h("h2", {}, "Timings"),
      h("dl", {}, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
  }

  showWebhook() {
    const callback = this.task.callback;
    if (!callback) {
      this.webhook.replaceChildren(h("h2", {}, "Webhook"), h("p", { class: "muted" }, "No callback_url."));
      return;
    }
    const rows = callback.deliveries.map((d) => h("tr", {}, h("td", {}, d.event), h("td", {}, String(d.attempts)),
      h("td", {}, d.status_code === null ? "—" : String(d.status_code)),
      h("td", {}, d.delivered ? "delivered" : d.error || "pending")));
    this.webhook.replaceChildren(h("h2", {}, "Webhook"), h("p", { class: "mono small wrap" }, callback.url),
      rows.length ? h("div", { class: "table-wrap" }, h("table", { id: "deliveries" },
        h("thead", {}, h("tr", {}, ["event", "attempts", "status", "outcome"].map((t) => h("th", {}, t)))), h("tbody", {}, rows)))
        : h("p", { class: "muted" }, "No delivery yet."));
  }

  card(index) {
    let card = this.cards.get(index);
    if (card) return card;
    const planned = (this.task.samples || []).find((s) => s.index === index);
    const text = h("pre", { class: "text" });
    const foot = h("div", { class: "foot" });
    const state = h("span", { class: "sample-state" });
    const root = h("article", { class: "sample", dataset: { index: String(index), status: planned ? planned.status : "running" } },
      h("header", {}, h("strong", {}, `#${index}`),
        h("span", { class: "muted small" }, planned ? `${planned.path} · T=${planned.temperature}` : ""), state),
      text, foot);
    card = { root, text, foot, state };
    this.cards.set(index, card);
    const after = [...this.cards.keys()].filter((i) => i > index).sort((a, b) => a - b)[0];
    if (after !== undefined) this.sampleGrid.insertBefore(root, this.cards.get(after).root);
    else this.sampleGrid.append(root);
    this.setCardStatus(card, planned ? planned.status : "queued");
    return card;
  }

  setCardStatus(card, status) {
    card.root.dataset.status = status;
    card.state.replaceChildren(badge(status));
    card.root.classList.toggle("writing", status === "running");
  }

  showText(index, text) {
    const card = this.card(index);
    card.text.textContent = text;
    if (card.root.dataset.status !== "running") this.setCardStatus(card, "running");
  }

  showSample(index, sample) {
    const card = this.card(index);
    card.text.textContent = sample.text || "";
    this.setCardStatus(card, sample.status);
    const facts = [];
    if (sample.object) facts.push(h("span", { class: "sample-answer" }, "a valid object"));  // its text is the JSON
    else if (sample.answer !== null) facts.push(h("span", { class: "sample-answer" }, `answer ${sample.answer}`));
    if (sample.schema_error) facts.push(h("span", { class: "error schema-error" }, `not valid: ${sample.schema_error}`));
    if (sample.confidence !== null) facts.push(h("span", {}, `confidence ${percent(sample.confidence)}`));
    facts.push(h("span", {}, `${sample.tokens.completion} tokens`));
    if (sample.latency_ms !== null) facts.push(h("span", {}, fmtSeconds(sample.latency_ms)));
    if (sample.error) facts.push(h("span", { class: "error" }, `${sample.error.code}: ${sample.error.message}`));
    card.foot.replaceChildren(...facts);
  }

  // --- live --------------------------------------------------------------------------
  /** Follow the task's events (resuming after a drop) until its end. */
  async follow() {
    let last = null;
    let failures = 0;
    while (!this.signal.aborted) {
      try {
        const headers = authHeaders();
        if (last) headers["Last-Event-ID"] = last;
        const response = await fetch(`${this.path}/events`, { headers, signal: this.signal, cache: "no-store" });
        if (response.status === 401 && state.auth) {
          await askKey("That key was refused: enter a valid one.");
          continue;
        }
        if (!response.ok) {
          const data = await response.json().catch(() => ({}));
          throw new ApiError(response.status, (data.error || {}).code, (data.error || {}).message || response.statusText);
        }
        for await (const event of sseEvents(response.body)) {
          failures = 0;
          last = event.id;
          await this.apply(event);
          if (isFinal(event)) return;
        }
      } catch (error) {
        if (this.signal.aborted) return;
        if (error instanceof ApiError && error.status !== 503) throw error;
      }
      // the stream ended early (a restart, a store outage): the task may have ended meanwhile
      failures += 1;
      if (failures > MAX_RECONNECTS) {
        this.problem.textContent = "The event stream keeps failing; reload the page to try again.";
        this.problem.hidden = false;
        return;
      }
      await sleep(Math.min(8000, 250 * 2 ** failures), this.signal);
      const task = await api("GET", this.path).catch(() => null);
      if (task && isTerminal(task.status)) {
        this.render(task);
        return;
      }
    }
  }

  async apply(event) {
    const data = event.data;
    const kind = names.events;
    if (event.event === kind.delta) {
      const text = (this.texts.get(data.index) || "").slice(0, data.offset) + data.text;
      this.texts.set(data.index, text);
      if (!this.samples.has(data.index)) this.showText(data.index, text);
    } else if (event.event === kind.sample) {
      this.samples.set(data.index, data);
      const stored = this.task.samples.findIndex((s) => s.index === data.index);
      if (stored >= 0) this.task.samples[stored] = data;
      this.showSample(data.index, data);
      this.showVotes();
    } else if (event.event === kind.preliminary) {
      this.task.preliminary = data;
      this.showAnswer();
    } else if (event.event === kind.result) {
      this.render(data);
    } else if (event.event === kind.status) {
      if (data.status === "running" && !this.task.samples.length) {
        this.render(await api("GET", this.path)); // the worker has planned the samples now
      } else if (isTerminal(data.status)) {
        this.render(await api("GET", this.path)); // e.g. cancelled: the record tells the rest
      } else {
        this.task.status = data.status;
        this.update();
      }
    }
  }

  /** Webhook attempts are recorded after the task's end: show them as they come. */
  async watchDeliveries() {
    for (let i = 0; i < 20 && !this.signal.aborted && this.task.callback; i++) {
      const pending = this.task.callback.deliveries.some((d) => !d.delivered && !d.error);
      if (i > 0 && !pending) return;
      await sleep(3000, this.signal);
      if (this.signal.aborted) return;
      this.task = await api("GET", this.path);
      this.showWebhook();
    }
  }

  async cancelTask() {
    this.cancel.disabled = true;
    try {
      this.render(await api("DELETE", this.path));
    } catch (error) {
      this.problem.textContent = `Could not cancel: ${error.message}`;
      this.problem.hidden = false;
      this.cancel.disabled = false;
    }
  }
}

// --- start ---------------------------------------------------------------------------
async function start() {
  const config = await fetch("/console/config.json", { cache: "no-store" }).then((r) => r.json());
  state.auth = Boolean(config.auth);
  names.statuses = config.statuses;
  names.terminal = config.terminal;
  names.statusEvents = config.status_events;
  names.finishedSamples = config.finished_samples;
  names.events = config.events;
  names.modes = config.modes;
  names.defaultMode = config.default_mode;
  names.taskTypes = config.task_types;
  names.defaultTaskType = config.default_task_type;
  $("#key-dialog").addEventListener("cancel", (event) => event.preventDefault());
  $("#key-forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORAGE);
    showKeyState();
    route(); // asks for a key before its first call
  });
  showKeyState();
  window.addEventListener("hashchange", route);
  route();
}

start();
