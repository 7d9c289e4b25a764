// Millstream's web console: plain JavaScript over the controller's REST API (same origin).
// Pages by hash: #/datastreams, #/tables, #/tables/<table>, #/workers, #/errors. Every text
// from the API goes into the page as a text node (el() below); nothing is parsed as HTML.
"use strict";

const TOKEN_KEY = "millstream.apiToken";
const POLL_MS = 2000;
const HISTORY_S = 300; // the live chart keeps the last 5 minutes, in this page only
const RATE_S = 10; // rows/s is averaged over this many seconds

// ---------------------------------------------------------------- DOM helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function table(headers, rows, empty) {
  if (!rows.length) return el("p", { class: "muted" }, empty || "none");
  return el(
    "table",
    {},
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label || h)))),
    el("tbody", {}, rows),
  );
}

const num = (v) => el("td", { class: "num" }, v === null || v === undefined ? "–" : fmt(v));
const fmt = (v) => (typeof v === "number" ? v.toLocaleString("en-US") : String(v));
const badge = (state) => el("span", { class: `state state-${state}` }, state);
const code = (text) => el("code", {}, text);

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, seconds);
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}
// The controller's clock, from the Date header of its last answer: ages are computed against
// it, so a browser whose clock is off still shows how old a heartbeat or a commit is.
let clockOffset = 0;
const serverNow = () => Date.now() / 1000 + clockOffset;
const sinceEpoch = (t) => (t ? ago(serverNow() - t) + " ago" : "–");
const bytes = (n) =>
  n < 1024 ? `${n} B` : n < 1 << 20 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / (1 << 20)).toFixed(1)} MiB`;

// Replace a section's content only when what it shows changed, so that a button under the
// pointer stays the same element between refreshes.
function fill(section, data, build) {
  const key = JSON.stringify(data);
  if (section.dataset.key === key) return;
  section.dataset.key = key;
  section.replaceChildren(build());
}

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, body, what) {
    super(body.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
    this.what = what;
  }
  describe() {
    const head = this.status ? `${this.status} ${this.body.error || "error"}` : this.body.error;
    let text = `${this.what} failed: ${head}: ${this.body.message}`;
    if (this.status === 401) {
      text +=
        "\nEnter the controller's API token in the field at the top and press Save " +
        "(it is kept in this browser's localStorage and sent as Authorization: Bearer).";
    }
    return text;
  }
}

function token() {
  return localStorage.getItem(TOKEN_KEY) || "";
}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const what = `${method} ${path}`;
  let response;
  try {
    response = await fetch(path, init);
  } catch (e) {
    throw new ApiError(0, { error: "Unreachable", message: `the controller did not answer (${e.message})` }, what);
  }
  const date = Date.parse(response.headers.get("Date") || "");
  if (!Number.isNaN(date)) {
    const offset = date / 1000 - Date.now() / 1000;
    clockOffset = Math.abs(offset) > 2 ? offset : 0; // the header has 1 s resolution
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (e) {
    data = null;
  }
  if (!response.ok) {
    const errBody =
      data && typeof data === "object" && data.message
        ? data
        : { error: `HTTP ${response.status}`, message: text.slice(0, 300) || response.statusText };
    throw new ApiError(response.status, errBody, what);
  }
  return data;
}

const path = (...parts) => "/" + parts.map(encodeURIComponent).join("/");

// ---------------------------------------------------------------- alerts

function alert(kind, id, text) {
  const box = document.getElementById("alerts");
  let node = id && box.querySelector(`[data-id="${id}"]`);
  if (!text) {
    if (node) node.remove();
    return;
  }
  const fresh = el(
    "div",
    { class: `alert alert-${kind}`, "data-id": id || "" },
    el("span", { class: "text" }, text),
    el("button", { type: "button", title: "Dismiss", onclick: (e) => e.target.parentNode.remove() }, "×"),
  );
  if (node) node.replaceWith(fresh);
  else box.append(fresh);
}

function showError(err, id) {
  alert("error", id, err instanceof ApiError ? err.describe() : `error: ${err.message || err}`);
}

// An action (a button): its result or its error stays shown until dismissed or the next one.
async function act(what, fn) {
  alert(null, "action", null);
  try {
    const text = await fn();
    alert("ok", "action", text);
  } catch (err) {
    if (err instanceof ApiError) err.what = what; // "pause orders failed: 401 ..."
    showError(err, "action");
  }
  refreshNow();
}

// ---------------------------------------------------------------- datastreams

// What each command is allowed from (core/lifecycle.py COMMAND_TARGETS).
const COMMANDS = {
  pause: ["READY"],
  resume: ["PAUSED", "STOPPED", "ERROR"],
  stop: ["READY", "PAUSED"],
  delete: ["INITIALIZING", "READY", "PAUSED", "STOPPING", "STOPPED", "ERROR"],
};

function describeSource(src) {
  if (!src) return "";
  if (src.kind === "kafka") {
    const topics = src.topics ? src.topics.join(", ") : src.topic_pattern ? `/${src.topic_pattern}/` : src.topic;
    return `kafka ${topics} @ ${src.bootstrap_servers}`;
  }
  if (src.kind === "files") return `files ${src.path}`;
  return src.kind;
}

function command(name, cmd) {
  return act(`${cmd} ${name}`, async () => {
    const rec =
      cmd === "delete"
        ? await api("DELETE", path("datastreams", name))
        : await api("POST", path("datastreams", name, cmd));
    return `${cmd}: datastream ${rec.name} is now ${rec.state} (version ${rec.version})`;
  });
}

// A READY datastream's writer health (the REST record's `health`): running, retrying with
// the error and since when, stalled; empty in other states (the state says it).
function healthText(h) {
  if (!h) return "";
  if (h.status === "running" || h.status === "starting") return h.status;
  if (h.status === "not running") return "not running (no live worker runs it)";
  const since = h.since ? ` for ${ago(serverNow() - h.since)}` : "";
  const retry = h.retry_at ? `, next try in ${ago(h.retry_at - serverNow())}` : "";
  return `${h.status}${since}${retry}${h.error ? `: ${h.error}` : ""}`;
}

function datastreamRow(d) {
  const buttons = Object.entries(COMMANDS).map(([cmd, from]) =>
    el(
      "button",
      {
        type: "button",
        "data-action": cmd,
        disabled: !from.includes(d.state),
        title: `${cmd} (allowed from ${from.join(", ")})`,
        onclick: () => {
          if (cmd === "delete" && !window.confirm(`Delete datastream ${d.name}? Its table stays.`)) return;
          command(d.name, cmd);
        },
      },
      cmd[0].toUpperCase() + cmd.slice(1),
    ),
  );
  return el(
    "tr",
    { "data-datastream": d.name },
    el("td", {}, el("strong", {}, d.name)),
    el("td", { class: "ds-state" }, badge(d.state)),
    el(
      "td",
      { class: `ds-health${d.health && d.health.status !== "running" && d.health.status !== "starting" ? " error-text" : ""}` },
      healthText(d.health),
    ),
    el("td", {}, ...(d.tables || [d.table]).flatMap((t, i) => [i ? ", " : "", el("a", { href: `#/tables/${encodeURIComponent(t)}` }, t)])),
    el("td", {}, describeSource(d.spec.source)),
    num(d.version),
    el("td", {}, sinceEpoch(d.updated_at)),
    el("td", { class: "error-text" }, d.last_error || ""),
    el("td", { class: "actions" }, buttons),
  );
}

const EXAMPLE_SPEC = `name: orders
source: {kind: kafka, bootstrap_servers: 127.0.0.1:9092, topic: orders}
table:
  primary_key: [order_id]
  mode: upsert
schema: {order_id: long, status: string, amount: double}
`;

const datastreamsPage = {
  title: "Datastreams",
  mount(root) {
    this.list = el("section", { id: "datastream-list" });
    const spec = el("textarea", { id: "spec", spellcheck: "false", "aria-label": "Datastream spec (YAML)" });
    spec.value = EXAMPLE_SPEC;
    const create = () =>
      act("create", async () => {
        let body;
        try {
          body = window.MillstreamYaml.parse(spec.value);
        } catch (e) {
          throw new ApiError(0, { error: "InvalidSpecError", message: `invalid spec: not valid YAML: ${e.message}` }, "create");
        }
        const rec = await api("POST", "/datastreams", body);
        const warned = (rec.warnings || []).map((w) => ` Warning: ${w}`).join("");
        return `created datastream ${rec.name} (${rec.state}; the controller makes it READY once its table exists)${warned}`;
      });
    root.append(
      el("h2", {}, "Datastreams"),
      this.list,
      el("h3", {}, "Create a datastream"),
      el(
        "p",
        { class: "muted" },
        "The spec as in a spec file (YAML, or JSON), as ",
        code("millstream datastream create -f spec.yaml"),
        " sends it. The controller validates it and names any bad field.",
      ),
      spec,
      el("p", {}, el("button", { type: "button", id: "create", onclick: create }, "Create")),
    );
  },
  async refresh() {
    const list = await api("GET", "/datastreams");
    fill(this.list, list, () =>
      table(
        ["Name", "State", "Writer", "Table", "Source", { label: "Version", num: true }, "Updated", "Last error", "Actions"],
        list.map(datastreamRow),
        "No datastream yet: create one below.",
      ),
    );
    // The "updated" ages go stale between changes; refresh them in place.
    for (const d of list) {
      const row = this.list.querySelector(`tr[data-datastream="${CSS.escape(d.name)}"]`);
      if (row) row.children[6].textContent = sinceEpoch(d.updated_at);
    }
  },
};

// ---------------------------------------------------------------- tables

const tablesPage = {
  title: "Tables",
  mount(root) {
    this.list = el("section", {});
    root.append(el("h2", {}, "Tables"), this.list);
  },
  async refresh() {
    const list = await api("GET", "/datastreams");
    const rows = [];
    for (const d of list) {
      for (const t of d.tables || [d.table]) {
        // a table of a multi-table datastream paused on its own (the others run on)
        const state = (d.paused_tables || []).includes(t) ? "PAUSED" : d.state;
        rows.push({ table: t, datastream: d.name, state, kind: "table" });
        rows.push({ table: `${t}__dead_letter`, datastream: d.name, state, kind: "dead-letter table" });
      }
    }
    fill(this.list, rows, () =>
      table(
        ["Table", "Kind", "Written by", "State"],
        rows.map((r) =>
          el(
            "tr",
            {},
            el("td", {}, el("a", { href: `#/tables/${encodeURIComponent(r.table)}` }, r.table)),
            el("td", {}, r.kind),
            el("td", {}, r.datastream),
            el("td", {}, badge(r.state)),
          ),
        ),
        "No table: tables are created with their datastream.",
      ),
    );
  },
};

// Samples of the live chart, per table: {t, freshness (s), rate (rows/s), upper}.
const history = new Map();

function record(tableName, info) {
  const now = serverNow();
  const samples = history.get(tableName) || [];
  const lags = info.partitions.map((p) => p.availability_lag_ms).filter((v) => v !== null);
  const upper = info.partitions.reduce((s, p) => s + (p.current_offset || 0), 0);
  // rows/s over the last RATE_S seconds (or since the previous sample, if older).
  const base = samples.find((x) => x.t >= now - RATE_S) || samples[samples.length - 1];
  const rate = base && now > base.t ? Math.max(0, (upper - base.upper) / (now - base.t)) : null;
  samples.push({ t: now, freshness: lags.length ? Math.max(...lags) / 1000 : null, rate, upper });
  while (samples.length && samples[0].t < now - HISTORY_S) samples.shift();
  history.set(tableName, samples);
  return samples;
}

function chart(samples) {
  const W = 760, H = 190, L = 56, R = 64, T = 12, B = 26;
  const now = serverNow();
  // The time axis spans what was sampled since the page opened, up to HISTORY_S.
  const span = Math.min(HISTORY_S, Math.max(20, samples.length ? now - samples[0].t : 0));
  const x = (t) => L + ((t - (now - span)) / span) * (W - L - R);
  const top = (vals) => {
    const m = Math.max(0, ...vals.filter((v) => v !== null));
    return m > 0 ? m * 1.15 : 1;
  };
  const fMax = top(samples.map((s) => s.freshness));
  const rMax = top(samples.map((s) => s.rate));
  const y = (v, max) => T + (1 - v / max) * (H - T - B);
  const line = (key, max, color) => {
    const pts = samples.filter((s) => s[key] !== null).map((s) => `${x(s.t).toFixed(1)},${y(s[key], max).toFixed(1)}`);
    return svg("polyline", { points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 2 });
  };
  const g = svg("svg", {
    class: "chart",
    width: W,
    height: H,
    viewBox: `0 0 ${W} ${H}`,
    role: "img",
    "aria-label": "freshness and rows per second",
    "data-samples": samples.length,
  });
  for (let i = 0; i <= 4; i++) {
    const yy = T + (i / 4) * (H - T - B);
    g.append(svg("line", { x1: L, x2: W - R, y1: yy, y2: yy, stroke: "#e6eaef" }));
    g.append(svg("text", { x: L - 6, y: yy + 4, "text-anchor": "end" }, short(fMax * (1 - i / 4)) + " s"));
    g.append(svg("text", { x: W - R + 6, y: yy + 4 }, short(rMax * (1 - i / 4)) + "/s"));
  }
  for (const [t, label] of [[now - span, `-${ago(span)}`], [now - span / 2, `-${ago(span / 2)}`], [now, "now"]]) {
    g.append(svg("text", { x: x(t), y: H - 8, "text-anchor": "middle" }, label));
  }
  g.append(line("freshness", fMax, "#c0262d"), line("rate", rMax, "#1f5fa8"));
  return g;
}

function short(v) {
  // A figure rounded to zero reads 0, never -0.00 (a rate or a lag is never below zero).
  if (!(Math.abs(v) >= 0.005)) return "0";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (v >= 100) return v.toFixed(0);
  return v.toFixed(v >= 10 ? 1 : 2);
}

function card(label, value, id) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value", id }, value));
}

const tablePage = {
  mount(root, tableName) {
    this.table = tableName;
    this.title = `Table ${tableName}`;
    this.head = el("section", {});
    this.cards = el("section", {});
    this.chart = el("section", {});
    this.partitions = el("section", {});
    this.segments = el("section", {});
    this.sealing = el("section", {});
    root.append(
      el("h2", {}, "Table ", el("span", { id: "table-name" }, tableName)),
      this.head,
      this.cards,
      el("h3", {}, "Freshness and rows/s (live, last 5 minutes)"),
      el(
        "p",
        { class: "legend muted" },
        el("span", {}, el("span", { class: "swatch", style: "background:#c0262d" }), "freshness: the largest availability lag of its partitions (left axis)"),
        el("span", {}, el("span", { class: "swatch", style: "background:#1f5fa8" }), "rows/s committed: how fast the shard uppers advance, over 10 s (right axis)"),
      ),
      this.chart,
      el("h3", {}, "Partitions"),
      this.partitions,
      el("h3", {}, "Sealing"),
      this.sealing,
      el("h3", {}, "Segments"),
      this.segments,
    );
  },
  async refresh() {
    const t = encodeURIComponent(this.table);
    const [info, segs, debug, streams] = await Promise.all([
      api("GET", `/tables/${t}/consumingSegmentsInfo`),
      api("GET", `/tables/${t}/segments`),
      api("GET", `/tables/${t}/debugInfo`),
      api("GET", "/datastreams"),
    ]);
    const samples = record(this.table, info);
    const last = samples[samples.length - 1];
    const ds = streams.find((d) => d.name === info.datastream);
    const seg = ds ? ds.spec.segments || {} : null;
    const health = ds ? healthText(ds.health) : "";
    fill(this.head, [info.datastream, info.state, info.upstream_error, seg, health], () =>
      el(
        "div",
        {},
        el(
          "p",
          {},
          "Written by datastream ",
          info.datastream ? el("strong", {}, info.datastream) : "–",
          " ",
          info.state ? badge(info.state) : "",
          health ? el("span", { id: "writer-health", class: ds.health.status === "running" ? "" : "error-text" }, ` writer ${health}`) : "",
          seg
            ? ` · sealing pauseless, compaction ${
                seg.compaction === false ? "off" : `on (${seg.compaction_min_segments || 4} segments at a time)`
              }`
            : "",
        ),
        info.upstream_error ? el("p", { class: "error-text", id: "upstream-error" }, info.upstream_error) : null,
      ),
    );
    const lagTotal = info.partitions.reduce((s, p) => s + (p.records_lag || 0), 0);
    fill(this.cards, [segs.live_rows, segs.row_count, segs.segment_count, segs.deleted_rows, segs.manifest_version, lagTotal, last.freshness, last.rate], () =>
      el(
        "div",
        { class: "grid" },
        card("rows", segs.live_rows === null || segs.live_rows === undefined ? "–" : fmt(segs.live_rows), "rows"),
        card("row versions stored (merged on read)", fmt(segs.row_count), "row-versions"),
        card("segments", fmt(segs.segment_count)),
        card("records lag (all partitions)", fmt(lagTotal)),
        card("freshness (largest availability lag)", last.freshness === null ? "–" : ago(last.freshness), "freshness"),
        card("rows/s committed", last.rate === null ? "–" : short(last.rate), "rate"),
        card("manifest version", fmt(segs.manifest_version)),
      ),
    );
    this.chart.replaceChildren(chart(samples));
    // Ages ("12 s ago") are re-rendered every 10 s even when nothing else changed.
    const epoch10 = Math.floor(Date.now() / 10000);
    fill(this.partitions, [info.partitions, epoch10], () =>
      table(
        [
          { label: "Partition", num: true },
          { label: "Shard upper", num: true },
          { label: "Source latest offset", num: true },
          { label: "Records lag", num: true },
          { label: "Availability lag", num: true },
          "Last commit",
          "Latest segment",
          { label: "Consuming segments", num: true },
          "Serving workers",
        ],
        info.partitions.map((p) =>
          el(
            "tr",
            { "data-partition": p.partition },
            num(p.partition),
            num(p.current_offset),
            num(p.latest_upstream_offset),
            num(p.records_lag),
            el("td", { class: "num" }, p.availability_lag_ms === null ? "–" : ago(p.availability_lag_ms / 1000)),
            el("td", {}, sinceEpoch(p.last_commit_at)),
            el("td", {}, p.latest_segment ? code(p.latest_segment) : "–"),
            num(p.consuming_segments),
            el(
              "td",
              {},
              p.serving_workers.map((w) =>
                el("div", {}, `${w.worker_id} (${w.role}${w.running ? ", running" : ""}${w.alive ? "" : ", NOT alive"})`),
              ),
              p.error ? el("div", { class: "error-text" }, p.error) : null,
            ),
          ),
        ),
        "No partition yet: nothing committed and the source reported no offsets.",
      ),
    );
    fill(this.sealing, debug, () =>
      el(
        "div",
        {},
        el("h4", {}, "Segments in ERROR"),
        table(
          ["Segment", { label: "Partition", num: true }, "Last error", "Sealer", "What to do"],
          debug.segments_in_error.map((e) =>
            el(
              "tr",
              {},
              el("td", {}, code(e.segment)),
              num(e.partition),
              el("td", { class: "error-text" }, e.last_error || ""),
              el("td", {}, e.claimed_by || "unknown"),
              el("td", { class: "action" }, SEGMENT_ERROR_ACTION(e.segment)),
            ),
          ),
          "none",
        ),
        el("h4", {}, "Committing (being sealed)"),
        table(
          ["Segment", { label: "Partition", num: true }, "Age", "Claimed by", "Claim expires in"],
          debug.committing_segments.map((c) =>
            el("tr", {}, el("td", {}, code(c.segment)), num(c.partition), el("td", {}, ago(c.age_s)), el("td", {}, c.claimed_by || "–"), el("td", {}, ago(c.claim_expires_in_s))),
          ),
          "none",
        ),
        el("h4", {}, "Sealer queue and delete vectors"),
        table(
          [{ label: "Partition", num: true }, { label: "Segments not sealed", num: true }, { label: "Delete vectors", num: true }, { label: "Rows they delete", num: true }],
          partitionsOf(debug).map((p) => {
            const q = debug.sealer_queue.find((x) => x.partition === p);
            const dv = debug.delete_vectors.find((x) => x.partition === p);
            return el("tr", {}, num(p), num(q ? q.segments : 0), num(dv ? dv.vectors : 0), num(dv ? dv.rows : 0));
          }),
          "nothing queued, no delete vectors",
        ),
      ),
    );
    fill(this.segments, [segs.partitions, epoch10], () =>
      el(
        "div",
        {},
        segs.partitions.length
          ? segs.partitions.map((p) =>
              el(
                "details",
                { open: segs.partitions.length <= 4 },
                el(
                  "summary",
                  {},
                  `partition ${p.partition}: ${p.segments.length} segments, ${p.segments.filter((s) => s.state === "ONLINE").length} sealed, ${p.delete_vectors} delete vectors (${p.deleted_rows} rows deleted)`,
                ),
                table(
                  ["Segment", "State", { label: "Start offset", num: true }, { label: "End offset", num: true }, { label: "Rows", num: true }, { label: "Size", num: true }, "Created"],
                  p.segments.map((s) =>
                    el("tr", { "data-segment": s.name }, el("td", {}, code(s.name)), el("td", {}, badge(s.state)), num(s.start_offset), num(s.end_offset), num(s.rows), el("td", { class: "num" }, bytes(s.size_bytes)), el("td", {}, sinceEpoch(s.created_at))),
                  ),
                ),
              ),
            )
          : el("p", { class: "muted" }, "No segment yet."),
      ),
    );
  },
};

function partitionsOf(debug) {
  const ps = new Set([...debug.sealer_queue.map((x) => x.partition), ...debug.delete_vectors.map((x) => x.partition)]);
  return [...ps].sort((a, b) => a - b);
}

const SEGMENT_ERROR_ACTION = (name) =>
  `The sealer keeps retrying it with backoff; reads are not affected. Fix what the error names; ` +
  `if its data is lost, rebuild it from the source: millstream reingest ${name} (POST /segments/${name}/reingest).`;

// ---------------------------------------------------------------- workers

function loopText(l) {
  const name = l.table ? `${l.loop} of ${l.table}` : l.loop;
  if (l.consecutive_failures) return `${name}: failing (${l.consecutive_failures} in a row): ${l.last_error}`;
  return `${name}: ok, ${l.runs} runs${l.errors ? `, ${l.errors} errors so far` : ""}`;
}

const workersPage = {
  title: "Workers",
  mount(root) {
    this.list = el("section", {});
    root.append(el("h2", {}, "Workers"), this.list);
  },
  async refresh() {
    const workers = await api("GET", "/workers");
    fill(this.list, workers.map((w) => ({ ...w, heartbeat_age_s: Math.round(w.heartbeat_age_s) })), () =>
      table(
        ["Worker", "Status", "Alive", "Last heartbeat", "Assignments (datastream: role)", "Writers", "Background loops", "Started", "URL"],
        workers.map((w) =>
          el(
            "tr",
            { "data-worker": w.id },
            el("td", {}, el("strong", {}, w.id)),
            el("td", {}, badge(w.status)),
            el("td", {}, badge(w.alive ? "alive" : "dead")),
            el("td", {}, ago(w.heartbeat_age_s) + " ago"),
            el("td", {}, w.assignments.map((a) => el("div", {}, `${a.datastream}: ${a.role}`))),
            el(
              "td",
              {},
              w.writers.map((x) =>
                el("div", {}, `${x.datastream} (${x.role}, ${x.running ? "running" : "stopped"})`, x.error ? el("div", { class: "error-text" }, x.error) : null),
              ),
            ),
            el("td", {}, (w.loops || []).map((l) => el("div", { class: l.consecutive_failures ? "error-text" : null }, loopText(l)))),
            el("td", {}, sinceEpoch(w.started_at)),
            el("td", {}, w.url || "–"),
          ),
        ),
        "No worker has registered: start one with millstream worker --controller URL.",
      ),
    );
  },
};

// ---------------------------------------------------------------- errors

const errorsPage = {
  title: "Errors",
  mount(root) {
    this.list = el("section", {});
    root.append(
      el("h2", {}, "Recent errors"),
      el("p", { class: "muted" }, "What the controller and the workers report now: datastreams with an error, segments in ERROR, failing writers and background loops, workers that stopped heartbeating."),
      this.list,
    );
  },
  async refresh() {
    const [streams, workers] = await Promise.all([api("GET", "/datastreams"), api("GET", "/workers")]);
    const debugs = await Promise.all(
      streams.flatMap((d) => d.tables || [d.table]).map((t) => api("GET", `/tables/${encodeURIComponent(t)}/debugInfo`).catch(() => null)),
    );
    const rows = [];
    for (const d of streams) {
      if (d.state === "ERROR" || d.last_error) {
        rows.push({
          where: `datastream ${d.name} (${d.state})`,
          when: d.updated_at,
          error: d.last_error || "(no message)",
          action:
            d.state === "ERROR"
              ? `Fix what the error names, then resume it: the Resume button on Datastreams, or millstream datastream resume ${d.name} (ERROR -> READY).`
              : `None now: the datastream is ${d.state}; this is its last error.`,
        });
      }
    }
    debugs.forEach((debug) => {
      for (const e of debug ? debug.segments_in_error : []) {
        rows.push({ where: `segment ${e.segment} (table ${debug.table}, partition ${e.partition})`, when: null, error: e.last_error || "(no message)", action: SEGMENT_ERROR_ACTION(e.segment) });
      }
    });
    for (const w of workers) {
      if (!w.alive) {
        rows.push({
          where: `worker ${w.id}`,
          when: w.heartbeat_at,
          error: `no heartbeat for ${ago(w.heartbeat_age_s)}`,
          action: "Check the worker process (millstream worker --controller URL); its writers move to an alive worker.",
        });
      }
      for (const x of w.writers) {
        if (x.health && x.health.status === "stalled") {
          rows.push({
            where: `writer of ${x.datastream} on worker ${w.id} (stalled)`,
            when: x.health.since,
            error: x.health.error || "stalled",
            action: `The watchdog restarts the writer with backoff (restarts so far: ${x.health.stall_restarts}). If it stays stalled: pause and resume ${x.datastream}, then check its source and the metadata store; the worker's log names the partitions.`,
          });
        } else if (x.error) {
          rows.push({ where: `writer of ${x.datastream} on worker ${w.id}`, when: w.heartbeat_at, error: x.error, action: "The worker restarts the writer after a backoff (doubling, up to 5 min); fix what the error names (the source, the stores). Errors that need you put the datastream in ERROR." });
        }
      }
      for (const l of w.loops || []) {
        if (l.consecutive_failures) {
          const retry = l.next_attempt_at ? ` (next attempt in ${ago(l.next_attempt_at - serverNow())})` : "";
          rows.push({
            where: `${l.loop}${l.table ? ` of table ${l.table}` : ""} on worker ${w.id}`,
            when: l.last_error_at,
            error: `${l.last_error} (${l.consecutive_failures} failures in a row)`,
            action: `Retried with backoff${retry}; fix what the error names. ${l.loop === "maintainer" ? "millstream table maintain --dry-run shows it by hand." : "The table's debugInfo shows the sealer queue."}`,
          });
        }
      }
    }
    fill(this.list, [rows.map((r) => [r.where, r.error, r.action]), Math.floor(Date.now() / 10000)], () =>
      table(
        ["Where", "When", "Error", "What to do"],
        rows.map((r) => el("tr", {}, el("td", {}, r.where), el("td", {}, r.when ? sinceEpoch(r.when) : "–"), el("td", { class: "error-text" }, r.error), el("td", { class: "action" }, r.action))),
        "No error reported.",
      ),
    );
  },
};

// ---------------------------------------------------------------- routing and polling

let current = null;
let generation = 0;
let timer = null;

function route() {
  const hash = location.hash || "#/datastreams";
  const parts = hash.replace(/^#\/?/, "").split("/");
  let page = datastreamsPage;
  let arg = null;
  if (parts[0] === "tables" && parts[1]) {
    page = tablePage;
    arg = decodeURIComponent(parts.slice(1).join("/"));
  } else if (parts[0] === "tables") page = tablesPage;
  else if (parts[0] === "workers") page = workersPage;
  else if (parts[0] === "errors") page = errorsPage;
  const root = document.getElementById("page");
  root.replaceChildren();
  alert(null, "refresh", null);
  page.mount(root, arg);
  current = page;
  document.title = `${page.title} · Millstream console`;
  for (const a of document.querySelectorAll("nav a")) {
    a.classList.toggle("active", a.dataset.page === (parts[0] || "datastreams"));
  }
  refreshNow();
}

async function poll(gen) {
  try {
    await Promise.all([current.refresh(), refreshHealth()]);
    if (gen !== generation) return;
    alert(null, "refresh", null);
    document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  } catch (err) {
    if (gen === generation) showError(err, "refresh");
  }
  if (gen === generation) timer = setTimeout(() => poll(gen), POLL_MS);
}

function refreshNow() {
  clearTimeout(timer);
  generation++;
  poll(generation);
}

async function refreshHealth() {
  const h = await api("GET", "/health");
  const node = document.getElementById("health");
  node.textContent = h.controller_id
    ? `controller ${h.controller_id}${h.leader ? " (leader)" : " (not leader)"}`
    : "no controller in this process";
}

function setupToken() {
  const input = document.getElementById("token");
  const state = document.getElementById("token-state");
  const show = () => {
    state.textContent = token() ? "token set" : "no token";
  };
  input.value = token();
  show();
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const value = input.value.trim();
    if (value) localStorage.setItem(TOKEN_KEY, value);
    else localStorage.removeItem(TOKEN_KEY);
    show();
    refreshNow();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    localStorage.removeItem(TOKEN_KEY);
    input.value = "";
    show();
    refreshNow();
  });
}

setupToken();
window.addEventListener("hashchange", route);
route();
