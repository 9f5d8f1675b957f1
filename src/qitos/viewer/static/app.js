// qitos viewer: a hand-written single-page app over the local JSON API.
// Every value that comes from a run or a session is put into the page with textContent
// (through el() below), never parsed as HTML: a "<script>" in a tool output stays text.
"use strict";

(function () {
  const app = document.getElementById("app");
  const liveBadge = document.getElementById("live");
  const POLL_BOARD_MS = 3000;
  const POLL_LIVE_MS = 1200;
  const OUTPUT_PREVIEW = 1500;

  // The controls' token: given once in the address qitos trace serve prints (?token=...), kept for
  // this tab only, and taken out of the address bar so that it is not copied along with a link.
  const TOKEN_KEY = "qitos-control-token";
  (function takeToken() {
    const params = new URLSearchParams(location.search);
    const given = params.get("token");
    if (given) {
      sessionStorage.setItem(TOKEN_KEY, given);
      params.delete("token");
      const rest = params.toString();
      history.replaceState(null, "", location.pathname + (rest ? `?${rest}` : "") + location.hash);
    }
  })();
  const controlToken = () => sessionStorage.getItem(TOKEN_KEY);

  // ------------------------------------------------------------------ helpers

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [key, value] of Object.entries(attrs)) {
        if (value === null || value === undefined || value === false) continue;
        if (key === "class") node.className = value;
        else if (key === "text") node.textContent = String(value);
        else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
        else if (key === "dataset") Object.assign(node.dataset, value);
        else if (key === "style") Object.assign(node.style, value); // CSSOM: allowed by the page's CSP
        else node.setAttribute(key, value === true ? "" : String(value));
      }
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(node, child);
      else if (child instanceof Node) node.appendChild(child);
      else node.appendChild(document.createTextNode(String(child)));
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function fmtNumber(v) {
    return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US");
  }

  function fmtDuration(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 60) return `${s.toFixed(2)} s`;
    const m = Math.floor(s / 60);
    return `${m} min ${Math.round(s - m * 60)} s`;
  }

  function fmtTime(iso) {
    if (!iso) return "–";
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString();
  }

  function short(id, n) {
    const s = String(id ?? "");
    return s.length > (n || 14) ? s.slice(0, n || 14) + "…" : s;
  }

  function json(value) {
    return JSON.stringify(value, null, 2);
  }

  function badge(value, kind) {
    const v = value === null || value === undefined ? "–" : String(value);
    return el("span", { class: `badge ${kind || "b-" + v.replace(/[^a-z_]/gi, "")}`, text: v });
  }

  function kv(rows) {
    return el(
      "dl",
      { class: "kv" },
      rows.filter((r) => r).map(([k, v]) => [el("dt", { text: k }), el("dd", null, v instanceof Node ? v : v ?? "–")])
    );
  }

  function section(title, ...children) {
    return el("section", { class: "card" }, el("h2", { text: title }), children);
  }

  function pre(value, cls) {
    return el("pre", { class: cls || "code", text: typeof value === "string" ? value : json(value) });
  }

  // A long text shown truncated with a button to see all of it.
  function longText(value, cls) {
    const textValue = typeof value === "string" ? value : json(value);
    const node = el("pre", { class: cls || "code" });
    if (textValue.length <= OUTPUT_PREVIEW) {
      node.textContent = textValue;
      return node;
    }
    let expanded = false;
    const button = el("button", { class: "link", type: "button" });
    const render = () => {
      node.textContent = expanded ? textValue : textValue.slice(0, OUTPUT_PREVIEW) + "\n…";
      button.textContent = expanded ? "show less" : `show all (${fmtNumber(textValue.length)} characters)`;
    };
    button.addEventListener("click", () => {
      expanded = !expanded;
      render();
    });
    render();
    return el("div", null, node, button);
  }

  async function api(path) {
    const response = await fetch("/api" + path, { cache: "no-store", headers: { Accept: "application/json" } });
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      throw new Error(`${response.status} ${response.statusText}`);
    }
    if (!response.ok) {
      const err = new Error((data && data.error) || response.statusText);
      err.status = response.status;
      throw err;
    }
    return data;
  }

  // One control action: POST JSON with the token; the answer (or the refusal) as an object.
  async function act(sessionId, action, body) {
    const response = await fetch(`/api/sessions/${encodeURIComponent(sessionId)}/${action}`, {
      method: "POST",
      cache: "no-store",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-Qitos-Token": controlToken() || "" },
      body: JSON.stringify(body || {}),
    });
    let data = null;
    try {
      data = await response.json();
    } catch (e) {
      data = { error: `${response.status} ${response.statusText}` };
    }
    return { ok: response.ok, status: response.status, data };
  }

  function showError(error) {
    clear(app);
    app.appendChild(
      el("div", { class: "card error-card" }, el("h1", { text: error.status === 404 ? "Not found" : "Error" }), el("p", { class: "error", text: error.message }), el("p", null, el("a", { href: "#/", text: "Back to the board" })))
    );
  }

  // ------------------------------------------------------------------ routing and polling

  let pollTimer = null;
  let routeToken = 0;

  function stopPolling() {
    if (pollTimer) clearTimeout(pollTimer);
    pollTimer = null;
    liveBadge.hidden = true;
  }

  function schedule(token, fn, ms, live) {
    if (token !== routeToken) return;
    liveBadge.hidden = !live;
    pollTimer = setTimeout(() => {
      if (token === routeToken) fn();
    }, ms);
  }

  function route() {
    stopPolling();
    routeToken += 1;
    const token = routeToken;
    const hash = location.hash.replace(/^#/, "") || "/";
    const parts = hash.split("/").filter((p) => p).map(decodeURIComponent);
    if (parts.length === 0) return boardPage(token);
    if (parts[0] === "runs" && parts.length === 2) return runPage(token, parts[1]);
    if (parts[0] === "runs" && parts.length === 5 && parts[2] === "steps" && parts[4] === "request")
      return requestPage(token, parts[1], Number(parts[3]));
    if (parts[0] === "sessions" && parts.length === 2) return sessionPage(token, parts[1]);
    if (parts[0] === "sessions" && parts.length === 5 && parts[2] === "steps" && parts[4] === "request")
      return sessionRequestPage(token, parts[1], Number(parts[3]));
    if (parts[0] === "evals" && parts.length === 1) return evalsPage(token);
    if (parts[0] === "evals" && parts.length === 2) return evalPage(token, parts[1]);
    if (parts[0] === "evals" && parts.length === 4 && parts[2] === "compare") return comparePage(token, parts[1], parts[3]);
    showError({ status: 404, message: `no page ${hash}` });
  }

  window.addEventListener("hashchange", route);

  // ------------------------------------------------------------------ board

  const board = { filter: "", status: "", sortKey: "started_at", sortDir: -1, sessionSortKey: "updated_at", sessionSortDir: -1 };

  const RUN_COLUMNS = [
    ["run_id", "Run"],
    ["status", "Status"],
    ["task", "Task"],
    ["agent", "Agent"],
    ["steps", "Steps"],
    ["stop_reason", "Stop reason"],
    ["tokens", "Tokens"],
    ["duration_s", "Duration"],
    ["started_at", "Started"],
  ];
  const SESSION_COLUMNS = [
    ["session_id", "Session"],
    ["lifecycle", "Lifecycle"],
    ["task", "Task"],
    ["agent", "Agent"],
    ["sequence", "Sequence"],
    ["parent_session_id", "Forked from"],
    ["updated_at", "Updated"],
  ];

  function compare(a, b, key, dir) {
    const x = a[key];
    const y = b[key];
    if (x === y) return 0;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  }

  function matches(row, keys) {
    const needle = board.filter.trim().toLowerCase();
    if (!needle) return true;
    return keys.some((k) => String(row[k] ?? "").toLowerCase().includes(needle));
  }

  function sortHeader(columns, state, keyName, dirName, rerender) {
    return el(
      "tr",
      null,
      columns.map(([key, label]) => {
        const active = state[keyName] === key;
        return el(
          "th",
          { "aria-sort": active ? (state[dirName] > 0 ? "ascending" : "descending") : null },
          el(
            "button",
            {
              type: "button",
              class: "sort" + (active ? " active" : ""),
              onclick: () => {
                if (state[keyName] === key) state[dirName] = -state[dirName];
                else {
                  state[keyName] = key;
                  state[dirName] = 1;
                }
                rerender();
              },
            },
            label,
            active ? (state[dirName] > 0 ? " ▲" : " ▼") : ""
          )
        );
      })
    );
  }

  function boardPage(token) {
    clear(app);
    const runsBox = el("div", { class: "table-wrap", id: "runs-table" }, el("p", { class: "muted", text: "Loading runs…" }));
    const sessionsBox = el("div", { class: "table-wrap", id: "sessions-table" }, el("p", { class: "muted", text: "Loading sessions…" }));
    const filterInput = el("input", { type: "search", id: "filter", placeholder: "Filter by id, task, agent, stop reason…", value: board.filter });
    const statusSelect = el(
      "select",
      { id: "status-filter", "aria-label": "status" },
      ["", "running", "completed", "stopped", "failed"].map((s) => el("option", { value: s, text: s || "any status" }))
    );
    statusSelect.value = board.status;
    const meta = el("p", { class: "muted small" });
    let data = { runs: null, sessions: null };

    const renderRuns = () => {
      clear(runsBox);
      if (!data.runs) return;
      const rows = data.runs.runs
        .filter((r) => !board.status || r.status === board.status)
        .filter((r) => matches(r, ["run_id", "task", "agent", "stop_reason", "status"]))
        .sort((a, b) => compare(a, b, board.sortKey, board.sortDir));
      if (!data.runs.runs.length) {
        runsBox.appendChild(el("p", { class: "muted", text: `No runs in ${data.runs.logdir} yet. Make one with: ${data.runs.demo_command}` }));
        return;
      }
      runsBox.appendChild(
        el(
          "table",
          { class: "grid" },
          el("thead", null, sortHeader(RUN_COLUMNS, board, "sortKey", "sortDir", renderRuns)),
          el(
            "tbody",
            null,
            rows.map((r) =>
              el(
                "tr",
                { dataset: { run: r.run_id } },
                el("td", null, el("a", { href: `#/runs/${encodeURIComponent(r.run_id)}`, class: "mono", text: short(r.run_id, 22) })),
                el("td", null, badge(r.status)),
                el("td", { class: "task", title: r.task || "" }, r.task || "–"),
                el("td", { class: "mono small" }, r.agent || "–"),
                el("td", { class: "num" }, fmtNumber(r.steps)),
                el("td", null, r.stop_reason ? badge(r.stop_reason, "b-reason") : "–"),
                el("td", { class: "num" }, fmtNumber(r.tokens)),
                el("td", { class: "num" }, fmtDuration(r.duration_s)),
                el("td", { class: "small" }, fmtTime(r.started_at))
              )
            )
          )
        )
      );
      if (!rows.length) runsBox.appendChild(el("p", { class: "muted", text: "No run matches the filter." }));
    };

    const renderSessions = () => {
      clear(sessionsBox);
      if (!data.sessions) return;
      if (!data.sessions.available) {
        sessionsBox.appendChild(el("p", { class: "muted", text: data.sessions.db ? `No session store at ${data.sessions.db}.` : "No session store configured: start the viewer with --db naming one." }));
        return;
      }
      const rows = data.sessions.sessions
        .filter((s) => matches(s, ["session_id", "task", "agent", "lifecycle"]))
        .sort((a, b) => compare(a, b, board.sessionSortKey, board.sessionSortDir));
      sessionsBox.appendChild(
        el(
          "table",
          { class: "grid" },
          el("thead", null, sortHeader(SESSION_COLUMNS, board, "sessionSortKey", "sessionSortDir", renderSessions)),
          el(
            "tbody",
            null,
            rows.map((s) =>
              el(
                "tr",
                { dataset: { session: s.session_id } },
                el("td", null, el("a", { href: `#/sessions/${encodeURIComponent(s.session_id)}`, class: "mono", text: short(s.session_id, 22) })),
                el("td", null, badge(s.lifecycle)),
                el("td", { class: "task", title: s.task || "" }, s.task || "–"),
                el("td", { class: "mono small" }, s.agent || "–"),
                el("td", { class: "num" }, fmtNumber(s.sequence)),
                el("td", null, s.parent_session_id ? el("a", { href: `#/sessions/${encodeURIComponent(s.parent_session_id)}`, class: "mono", text: short(s.parent_session_id, 18) }) : "–"),
                el("td", { class: "small" }, fmtTime(s.updated_at))
              )
            )
          )
        )
      );
      if (!data.sessions.sessions.length) sessionsBox.appendChild(el("p", { class: "muted", text: "No sessions in the store yet." }));
    };

    filterInput.addEventListener("input", () => {
      board.filter = filterInput.value;
      renderRuns();
      renderSessions();
    });
    statusSelect.addEventListener("change", () => {
      board.status = statusSelect.value;
      renderRuns();
    });

    app.appendChild(
      el(
        "div",
        null,
        el("div", { class: "toolbar" }, el("h1", { text: "Board" }), filterInput, statusSelect),
        meta,
        el("section", { class: "card" }, el("h2", { text: "Runs" }), runsBox),
        el("section", { class: "card" }, el("h2", { text: "Sessions" }), sessionsBox)
      )
    );

    const load = async () => {
      try {
        const [runs, sessions] = await Promise.all([api("/runs"), api("/sessions")]);
        if (token !== routeToken) return;
        data = { runs, sessions };
        meta.textContent = `Traces: ${runs.logdir}` + (sessions.db ? ` · Sessions: ${sessions.db}` : "");
        renderRuns();
        renderSessions();
        const live = runs.runs.some((r) => r.status === "running") || sessions.sessions.some((s) => s.lifecycle === "running");
        schedule(token, load, live ? POLL_LIVE_MS : POLL_BOARD_MS, live);
      } catch (error) {
        if (token === routeToken) showError(error);
      }
    };
    load();
  }

  // ------------------------------------------------------------------ run page

  const openSteps = new Map(); // run id -> Set of open step ids

  function callLabel(action) {
    const args = Object.entries(action.args || {})
      .map(([k, v]) => {
        let s = typeof v === "string" ? JSON.stringify(v) : JSON.stringify(v);
        if (s && s.length > 40) s = s.slice(0, 37) + "…";
        return `${k}=${s}`;
      })
      .join(", ");
    return `${action.name}(${args})`;
  }

  function stepTokens(step) {
    const usage = (((step.model || {}).response || {}).usage) || {};
    return (usage.input_tokens || 0) + (usage.output_tokens || 0);
  }

  function budgetBar(rv) {
    const u = rv.units || {};
    const max = u.max_input || u.available || u.used || 1;
    const pct = (v) => `${Math.max(0, Math.min(100, (100 * (v || 0)) / max)).toFixed(2)}%`;
    const free = Math.max(0, (u.available || 0) - (u.used || 0));
    const bar = el(
      "div",
      { class: "budget-bar", role: "img", "aria-label": `used ${u.used} of ${u.available} available ${rv.unit}` },
      el("span", { class: "seg used", style: { width: pct(u.used) }, title: `selected: ${fmtNumber(u.used)} ${rv.unit}` }),
      el("span", { class: "seg free", style: { width: pct(free) }, title: `free: ${fmtNumber(free)} ${rv.unit}` }),
      el("span", { class: "seg reserved", style: { width: pct(u.reserved_output) }, title: `reserved for output: ${fmtNumber(u.reserved_output)} ${rv.unit}` })
    );
    const legend = el(
      "p",
      { class: "small budget-legend" },
      el("span", { class: "key used" }),
      ` selected ${fmtNumber(u.used)}`,
      el("span", { class: "key free" }),
      ` free ${fmtNumber(free)} of ${fmtNumber(u.available)} available`,
      el("span", { class: "key reserved" }),
      ` reserved for output ${fmtNumber(u.reserved_output)}`,
      ` · max input ${fmtNumber(u.max_input)} ${rv.unit}`,
      u.omitted ? ` · omitted ${fmtNumber(u.omitted)} of ${fmtNumber(u.total)}` : ""
    );
    return el("div", { class: "budget" }, bar, legend);
  }

  function stepCard(runId, step, openSet) {
    const decision = step.decision || {};
    const actions = step.actions || [];
    const results = step.results || [];
    const failed = results.filter((r) => !r.ok).length;
    const rv = step.request_view;
    const details = el("details", { class: "step", id: `step-${step.step_id}`, dataset: { step: step.step_id } });
    if (openSet.has(step.step_id)) details.open = true;
    details.addEventListener("toggle", () => {
      if (details.open) openSet.add(step.step_id);
      else openSet.delete(step.step_id);
    });
    const tokens = stepTokens(step);
    details.appendChild(
      el(
        "summary",
        null,
        el("span", { class: "step-no", text: `#${step.step_id}` }),
        badge(decision.mode, "b-mode"),
        el("span", { class: "step-title" }, actions.length ? actions.map(callLabel).join("; ") : decision.mode === "final" ? "final answer" : decision.rationale || ""),
        results.length ? el("span", { class: failed ? "pill bad" : "pill good", text: failed ? `${failed} failed` : `${results.length} ok` }) : null,
        rv ? el("span", { class: "pill", text: `ctx ${fmtNumber(rv.units.used)}/${fmtNumber(rv.units.available)}` }) : null,
        rv && rv.receipts && rv.receipts.length ? el("span", { class: "pill warn", text: `${rv.receipts.length} receipt${rv.receipts.length > 1 ? "s" : ""}` }) : null,
        tokens ? el("span", { class: "pill", text: `${fmtNumber(tokens)} tok` }) : null,
        el("span", { class: "muted small right", text: `${fmtNumber(Math.round(step.duration_ms || 0))} ms` }),
        step.stop_reason ? badge(step.stop_reason, "b-reason") : null
      )
    );
    const body = el("div", { class: "step-body" });
    body.appendChild(
      el(
        "div",
        { class: "block" },
        el("h3", { text: "Decision" }),
        kv([
          ["mode", decision.mode],
          decision.rationale ? ["rationale", decision.rationale] : null,
          decision.final_answer ? ["final answer", longText(decision.final_answer, "answer")] : null,
          decision.meta && Object.keys(decision.meta).length ? ["meta", pre(decision.meta)] : null,
        ])
      )
    );
    if (actions.length) {
      body.appendChild(
        el(
          "div",
          { class: "block" },
          el("h3", { text: "Actions" }),
          actions.map((a) => el("div", { class: "action" }, el("div", null, el("strong", { class: "mono", text: a.name }), el("span", { class: "muted small mono", text: ` ${a.id}` })), pre(a.args || {})))
        )
      );
    }
    const observation = step.observation || {};
    if (results.length || observation.feedback || observation.env !== undefined) {
      body.appendChild(
        el(
          "div",
          { class: "block" },
          el("h3", { text: "Observations" }),
          results.map((r) =>
            el(
              "div",
              { class: "result " + (r.ok ? "ok" : "err") },
              el("div", null, el("strong", { class: "mono", text: r.name }), " ", badge(r.ok ? "ok" : r.error_kind || "error", r.ok ? "b-completed" : "b-failed"), el("span", { class: "muted small", text: ` ${fmtNumber(Math.round(r.duration_ms || 0))} ms${r.truncated ? " · truncated by the tool's output cap" : ""}` })),
              longText(r.ok ? (typeof r.output === "string" ? r.output : json(r.output)) : r.error || "", "output")
            )
          ),
          observation.feedback ? el("div", { class: "feedback" }, el("strong", { text: "feedback: " }), observation.feedback) : null,
          observation.env !== undefined ? kv([["environment", longText(observation.env)]]) : null
        )
      );
    }
    const diff = step.state_diff || [];
    body.appendChild(
      el(
        "div",
        { class: "block" },
        el("h3", { text: `State diff (${diff.length})` }),
        diff.length
          ? el(
              "table",
              { class: "grid diff" },
              el("thead", null, el("tr", null, el("th", { text: "op" }), el("th", { text: "field" }), el("th", { text: "change" }))),
              el(
                "tbody",
                null,
                diff.map((op) => {
                  const { op: kind, field, ...rest } = op;
                  let change = rest;
                  if (kind === "set") change = rest.value;
                  else if (kind === "extend") change = rest.items;
                  return el("tr", null, el("td", null, badge(kind, "b-op")), el("td", { class: "mono", text: field }), el("td", null, longText(change, "code small")));
                })
              )
            )
          : el("p", { class: "muted small", text: "no state change" })
      )
    );
    if (step.model) {
      const response = step.model.response || {};
      body.appendChild(
        el(
          "div",
          { class: "block" },
          el("h3", { text: "Model" }),
          kv([
            ["model", response.model || "–"],
            ["finish", response.finish_reason || "–"],
            ["usage", `${fmtNumber((response.usage || {}).input_tokens)} in · ${fmtNumber((response.usage || {}).output_tokens)} out`],
            response.text ? ["text", longText(response.text, "answer")] : null,
            response.tool_calls && response.tool_calls.length ? ["tool calls", pre(response.tool_calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments ?? c.raw_arguments })))] : null,
          ])
        )
      );
    }
    if (rv) {
      body.appendChild(
        el(
          "div",
          { class: "block" },
          el("h3", { text: "Request" }),
          budgetBar(rv),
          el("p", null, el("a", { href: `#/runs/${encodeURIComponent(runId)}/steps/${step.step_id}/request`, class: "button", text: "Open the request inspector" }))
        )
      );
    }
    if (step.critics && step.critics.length) body.appendChild(el("div", { class: "block" }, el("h3", { text: "Critics" }), pre(step.critics)));
    details.appendChild(body);
    return details;
  }

  function runHeader(detail) {
    const r = detail.run;
    return el(
      "div",
      null,
      el("p", { class: "crumbs" }, el("a", { href: "#/", text: "Board" }), " / run"),
      el("div", { class: "title-row" }, el("h1", { class: "mono", text: r.run_id }), badge(r.status)),
      el(
        "section",
        { class: "card" },
        kv([
          ["task", r.task],
          ["agent", r.agent],
          ["stop reason", r.stop_reason ? badge(r.stop_reason, "b-reason") : "–"],
          ["steps", fmtNumber(r.steps)],
          ["tokens", fmtNumber(r.tokens)],
          ["duration", fmtDuration(r.duration_s)],
          ["started", fmtTime(r.started_at)],
          ["ended", fmtTime(r.ended_at)],
          r.error ? ["error", el("span", { class: "error", text: r.error })] : null,
        ]),
        detail.manifest.summary && detail.manifest.summary.final_result ? el("div", null, el("h3", { text: "Final answer" }), longText(detail.manifest.summary.final_result, "answer")) : null
      )
    );
  }

  function runPage(token, runId) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading run…" }));
    if (!openSteps.has(runId)) openSteps.set(runId, new Set());
    const openSet = openSteps.get(runId);
    let eventsOpen = false;
    const load = async () => {
      try {
        const detail = await api(`/runs/${encodeURIComponent(runId)}`);
        if (token !== routeToken) return;
        const scroll = window.scrollY;
        clear(app);
        app.appendChild(runHeader(detail));
        const timeline = el("section", { class: "card" }, el("h2", { text: `Timeline (${detail.steps.length} step${detail.steps.length === 1 ? "" : "s"})` }));
        if (!detail.steps.length) timeline.appendChild(el("p", { class: "muted", text: detail.run.status === "running" ? "Waiting for the first step…" : "No step was committed." }));
        detail.steps.forEach((s) => timeline.appendChild(stepCard(detail.run.run_id, s, openSet)));
        app.appendChild(timeline);
        const eventsBox = el("details", { class: "card events" }, el("summary", null, el("h2", { class: "inline", text: "Events" })));
        eventsBox.open = eventsOpen;
        const eventsBody = el("div", null);
        eventsBox.appendChild(eventsBody);
        const loadEvents = async () => {
          const data = await api(`/runs/${encodeURIComponent(runId)}/events`);
          clear(eventsBody);
          eventsBody.appendChild(
            el(
              "table",
              { class: "grid events-table" },
              el("thead", null, el("tr", null, ["#", "type", "step", "phase", "ok", "details"].map((h) => el("th", { text: h })))),
              el(
                "tbody",
                null,
                data.events.map((e, i) =>
                  el(
                    "tr",
                    { class: e.ok === false ? "bad-row" : null },
                    el("td", { class: "num", text: i }),
                    el("td", null, badge(e.event_type, "b-event")),
                    el("td", { class: "num", text: e.step_id }),
                    el("td", { text: e.phase || "" }),
                    el("td", { text: e.ok === false ? "no" : "yes" }),
                    el("td", null, e.error ? el("div", { class: "error", text: e.error }) : null, e.payload ? longText(JSON.stringify(e.payload), "code small") : null)
                  )
                )
              )
            )
          );
        };
        eventsBox.addEventListener("toggle", () => {
          eventsOpen = eventsBox.open;
          if (eventsBox.open) loadEvents().catch((e) => eventsBody.appendChild(el("p", { class: "error", text: e.message })));
        });
        if (eventsOpen) await loadEvents();
        app.appendChild(eventsBox);
        window.scrollTo(0, scroll);
        const live = detail.run.status === "running";
        if (live) schedule(token, load, POLL_LIVE_MS, true);
        else liveBadge.hidden = true;
      } catch (error) {
        if (token === routeToken) showError(error);
      }
    };
    load();
  }

  // ------------------------------------------------------------------ request inspector

  // Exchange ids come as plain ids or, in compact summaries, as runs [first, last]: one chip per
  // id or run ("ex-000001 – ex-000003"), and the count is the number of ids, not of chips.
  function idChips(ids) {
    return (ids || []).map((item) => {
      if (!Array.isArray(item)) return { id: String(item), label: String(item), count: 1 };
      const [first, last] = item.map(String);
      const span = Number(last.replace(/\D/g, "")) - Number(first.replace(/\D/g, "")) + 1;
      return { id: first, label: first === last ? first : `${first} – ${last}`, count: Number.isFinite(span) && span > 0 ? span : 1 };
    });
  }

  function idCount(ids, declared) {
    if (typeof declared === "number") return declared;
    return idChips(ids).reduce((n, c) => n + c.count, 0);
  }

  function idList(title, ids, cls, units, declaredCount) {
    const chips = idChips(ids);
    return el(
      "div",
      { class: `idlist ${cls}` },
      el("h3", null, `${title} `, el("span", { class: "count", text: `(${idCount(ids, declaredCount)})` })),
      chips.length
        ? el(
            "ul",
            null,
            chips.map((c) => el("li", { class: "chip mono", dataset: { exchange: c.id } }, c.label, units && c.count === 1 && units[c.id] !== undefined ? el("span", { class: "units", text: ` ${fmtNumber(units[c.id])}` }) : null))
          )
        : el("p", { class: "muted small", text: "none" })
    );
  }

  function receiptCard(receipt) {
    return el(
      "div",
      { class: "receipt", dataset: { receipt: receipt.receipt_id } },
      el("h3", null, "Compaction receipt ", el("span", { class: "mono", text: receipt.receipt_id })),
      kv([
        ["policy", el("span", { class: "mono", text: receipt.policy_id })],
        ["omitted exchanges", el("span", null, idChips(receipt.input_exchange_ids).map((c) => el("span", { class: "chip mono", text: c.label })), el("span", { class: "muted small", text: ` (${idCount(receipt.input_exchange_ids, receipt.input_count)})` }))],
        ["output digest", el("span", { class: "mono small", text: receipt.output_digest })],
        ["model", receipt.model_reference || "none (no summary)"],
      ]),
      el("h4", { text: "Declared losses" }),
      (receipt.declared_losses || []).length ? el("ul", { class: "losses" }, receipt.declared_losses.map((l) => el("li", { text: l }))) : el("p", { class: "muted small", text: "none declared" })
    );
  }

  function requestView(rv) {
    const ex = rv.exchanges || {};
    const units = ex.units || null;
    const contributions = rv.contributions || {};
    const selected = contributions.selected || [];
    const dropped = contributions.dropped || [];
    return el(
      "div",
      { class: "request-view" },
      section(
        "Budget",
        kv([
          ["request id", el("span", { class: "mono small", text: rv.request_id })],
          ["target", rv.target ? el("span", { class: "mono small", text: Object.values(rv.target).filter((v) => v !== null && v !== "").join(" · ") || "–" }) : "–"],
          ["unit", rv.unit],
          ["messages", fmtNumber(rv.messages)],
          ["tools", (rv.tools || []).join(", ") || "none"],
        ]),
        budgetBar(rv)
      ),
      section(
        "Exchanges",
        el("div", { class: "columns" }, idList("Selected", ex.selected || [], "selected", units), idList("Protected", ex.protected || [], "protected", units), idList("Omitted", ex.omitted || [], "omitted", units, ex.omitted_count)),
        rv.pinned_task ? kv([["task kept", el("span", { class: "chip mono", text: rv.pinned_task })]]) : null,
        units ? null : el("p", { class: "muted small", text: `Unit counts per exchange are not recorded; totals: ${fmtNumber((rv.units || {}).used)} selected, ${fmtNumber((rv.units || {}).omitted)} omitted ${rv.unit}.` })
      ),
      section(
        "Context contributions",
        selected.length
          ? el(
              "table",
              { class: "grid" },
              el("thead", null, el("tr", null, ["id", "source", "units", "sensitivity", "revision"].map((h) => el("th", { text: h })))),
              el("tbody", null, selected.map((c) => el("tr", null, el("td", { class: "mono", text: c.contribution_id }), el("td", { text: c.source }), el("td", { class: "num", text: fmtNumber(c.units) }), el("td", null, badge(c.sensitivity, "b-sens")), el("td", { class: "mono small", text: short(c.revision || c.digest, 16) }))))
            )
          : el("p", { class: "muted small", text: "no contribution selected" }),
        dropped.length ? el("div", null, el("h3", { text: `Dropped (${dropped.length})` }), pre(dropped)) : null
      ),
      section(
        `Compaction receipts (${(rv.receipts || []).length})`,
        (rv.receipts || []).length ? rv.receipts.map(receiptCard) : el("p", { class: "muted", text: "Nothing was omitted from this request." }),
        rv.compaction_summary ? kv([["summary", pre(rv.compaction_summary)]]) : null,
        (rv.authorizing_receipt_ids || []).length ? kv([["authorizing receipts", el("span", { class: "mono small", text: rv.authorizing_receipt_ids.join(", ") })]]) : null
      ),
      (rv.reasons || []).length ? section("Selection reasons", el("ul", null, rv.reasons.map((r) => el("li", { text: r })))) : null
    );
  }

  function messageCard(message, index) {
    const calls = message.tool_calls || [];
    return el(
      "li",
      { class: `message role-${String(message.role || "unknown").replace(/[^a-z_]/gi, "")}`, dataset: { index: String(index) } },
      el("div", { class: "message-head" }, badge(message.role || "?", "b-role"), message.tool_call_id ? el("span", { class: "mono small", text: ` answers ${message.tool_call_id}` }) : null, message.secret ? el("span", { class: "muted small", text: " (secret: content not recorded)" }) : null),
      message.content !== null && message.content !== undefined && message.content !== "" ? longText(message.content, "message-content") : null,
      calls.length ? pre(calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments }))) : null
    );
  }

  function messagesSection(messages) {
    if (messages === null || messages === undefined) return section("Messages sent", el("p", { class: "muted", text: "This trace did not record the messages of its requests." }));
    return section(`Messages sent (${messages.length})`, el("ol", { class: "messages" }, messages.map(messageCard)));
  }

  function attemptsSection(attempts) {
    if (!attempts || !attempts.length) return null;
    return section(
      `Failed attempts (${attempts.length})`,
      el(
        "table",
        { class: "grid attempts" },
        el("thead", null, el("tr", null, ["attempt", "status", "reason", "error", "then"].map((h) => el("th", { text: h })))),
        el(
          "tbody",
          null,
          attempts.map((a) =>
            el(
              "tr",
              { class: a.final ? "final" : null },
              el("td", { class: "num", text: fmtNumber(a.attempt) }),
              el("td", { class: "num", text: a.status_code ?? "–" }),
              el("td", { text: a.reason || "–" }),
              el("td", { class: "small", text: a.error || "–" }),
              el("td", { text: a.final ? "gave up" : `retried after ${a.delay_s ?? "?"} s` })
            )
          )
        )
      )
    );
  }

  function requestPage(token, runId, stepId) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading request…" }));
    const base = `/runs/${encodeURIComponent(runId)}`;
    Promise.all([api(base), api(`${base}/steps/${stepId}/request`).catch((error) => ({ missing: error }))])
      .then(([detail, request]) => {
        if (token !== routeToken) return;
        clear(app);
        const modelSteps = detail.steps.filter((s) => s.request_view);
        const step = detail.steps.find((s) => s.step_id === stepId);
        const index = modelSteps.findIndex((s) => s.step_id === stepId);
        const prev = index > 0 ? modelSteps[index - 1] : null;
        const next = index >= 0 && index < modelSteps.length - 1 ? modelSteps[index + 1] : null;
        const runLink = `#/runs/${encodeURIComponent(detail.run.run_id)}`;
        app.appendChild(
          el(
            "div",
            null,
            el("p", { class: "crumbs" }, el("a", { href: "#/", text: "Board" }), " / ", el("a", { href: runLink, class: "mono", text: short(detail.run.run_id, 22) }), ` / step ${stepId} / request`),
            el(
              "div",
              { class: "title-row" },
              el("h1", { text: `Request inspector · step ${stepId}` }),
              el(
                "span",
                { class: "pager" },
                prev ? el("a", { href: `${runLink}/steps/${prev.step_id}/request`, text: `← step ${prev.step_id}` }) : null,
                next ? el("a", { href: `${runLink}/steps/${next.step_id}/request`, text: `step ${next.step_id} →` }) : null
              )
            )
          )
        );
        if (request.status === "failed") {
          app.appendChild(el("p", { class: "error", text: `The model request of step ${stepId} failed: nothing came back.` }));
          if (request.request_view) app.appendChild(requestView(request.request_view));
          const failedAttempts = attemptsSection(request.attempts);
          if (failedAttempts) app.appendChild(failedAttempts);
          app.appendChild(messagesSection(request.messages));
          return;
        }
        if (!step) {
          app.appendChild(el("p", { class: "error", text: `run ${detail.run.run_id} has no step ${stepId}` }));
          return;
        }
        if (!step.request_view) {
          app.appendChild(el("p", { class: "muted", text: `Step ${stepId} did not call the model (its decision came from the agent's decide).` }));
          return;
        }
        app.appendChild(requestView(step.request_view));
        if (!request.missing) {
          const attempts = attemptsSection(request.attempts);
          if (attempts) app.appendChild(attempts);
          app.appendChild(messagesSection(request.messages));
        }
        if (step.model) {
          const response = step.model.response || {};
          app.appendChild(
            section(
              "Model reply",
              kv([
                ["model", response.model || "–"],
                ["finish", response.finish_reason || "–"],
                ["usage", `${fmtNumber((response.usage || {}).input_tokens)} in · ${fmtNumber((response.usage || {}).output_tokens)} out${(response.usage || {}).estimated ? " (estimated: the server reported none)" : ""}`],
                ["request digest", el("span", { class: "mono small", text: step.model.request_digest || "–" })],
              ]),
              response.text ? longText(response.text, "answer") : null,
              response.tool_calls && response.tool_calls.length ? pre(response.tool_calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments ?? c.raw_arguments }))) : null
            )
          );
        }
      })
      .catch((error) => {
        if (token === routeToken) showError(error);
      });
  }

  // ------------------------------------------------------------------ session page

  function lineageNode(node) {
    return el(
      "li",
      { class: node.current ? "current" : null, dataset: { session: node.session_id } },
      el(
        "div",
        { class: "node" },
        node.current ? el("strong", { class: "mono", text: short(node.session_id, 26) }) : el("a", { href: `#/sessions/${encodeURIComponent(node.session_id)}`, class: "mono", text: short(node.session_id, 26) }),
        " ",
        badge(node.lifecycle),
        " ",
        badge(node.integrity === "verified" ? "verified" : "corrupt", node.integrity === "verified" ? "b-completed" : "b-failed"),
        el("div", { class: "small muted" }, "head ", el("span", { class: "mono", text: short(node.snapshot_id, 18), title: node.snapshot_id }), node.fork_snapshot_id ? [" · forked at ", el("span", { class: "mono", text: short(node.fork_snapshot_id, 18), title: node.fork_snapshot_id })] : null, node.relation === "delegate" ? [" · delegated by call ", el("span", { class: "mono", text: node.call_id || "" })] : null),
        node.integrity !== "verified" ? el("div", { class: "error small", text: node.integrity }) : null
      ),
      node.children && node.children.length ? el("ul", null, node.children.map(lineageNode)) : null
    );
  }

  const ENDED = new Set(["completed", "stopped", "failed"]);
  const lastAnswer = new Map(); // session id -> the last control answer shown on its page

  // Approve / reject the calls awaiting approval (also a delegated child's, answered through this
  // session), steer, pause and resume. Each answer is shown under the buttons and the page reloads.
  function controlsCard(s, ins, reload) {
    const card = el("section", { class: "card controls", id: "controls" }, el("h2", { text: "Controls" }));
    if (ENDED.has(s.lifecycle)) {
      card.appendChild(el("p", { class: "muted small", text: `This session has ended (${s.lifecycle}); fork it to go on.` }));
      return card;
    }
    if (!controlToken()) {
      card.appendChild(el("p", { class: "notice", text: "The controls need the address qitos trace serve printed (it carries this start's token): open the viewer there." }));
      return card;
    }
    const answer = el("p", { class: "small", id: "control-answer", role: "status" });
    const shown = lastAnswer.get(s.session_id);
    if (shown) {
      answer.textContent = shown.text;
      answer.className = shown.ok ? "small ok" : "small error";
    }
    const run = async (action, body, button) => {
      if (button) button.disabled = true;
      const result = await act(s.session_id, action, body);
      const data = result.data || {};
      let text;
      if (!result.ok) text = `${action} refused: ${data.error || result.status}` + (data.command ? ` · ${data.command}` : "");
      else if (action === "resume") text = `resumed in a new process (pid ${data.pid}): ${data.command} · output: ${data.log}`;
      else text = `${action}: done` + (data.receipt && data.receipt.position !== undefined ? ` at position ${data.receipt.position}` : "") + (data.next ? ` · then ${data.next}` : "");
      lastAnswer.set(s.session_id, { ok: result.ok, text });
      reload(true);
    };
    const waiting = ((ins && ins.tool_batch && ins.tool_batch.calls) || []).filter((c) => c.status === "awaiting_approval");
    if (waiting.length) {
      card.appendChild(
        el(
          "table",
          { class: "grid approvals" },
          el("thead", null, el("tr", null, ["call", "tool", "args", "answer"].map((h) => el("th", { text: h })))),
          el(
            "tbody",
            null,
            waiting.map((c) => {
              const reason = el("input", { type: "text", class: "reason", placeholder: "reason (the agent reads it)", "aria-label": `reason to reject ${c.call_id}` });
              const approve = el("button", { type: "button", class: "approve", text: "Approve" });
              const reject = el("button", { type: "button", class: "reject", text: "Reject" });
              approve.addEventListener("click", () => run("approve", { call_id: c.call_id }, approve));
              reject.addEventListener("click", () => run("reject", { call_id: c.call_id, reason: reason.value || null }, reject));
              return el(
                "tr",
                { dataset: { call: c.call_id } },
                el("td", { class: "mono small", text: c.call_id }, c.session_id ? el("div", { class: "muted small", text: `in delegated ${short(c.session_id, 18)}` }) : null),
                el("td", { class: "mono", text: c.tool }),
                el("td", null, longText(c.args, "code small")),
                el("td", null, approve, " ", reject, " ", reason)
              );
            })
          )
        )
      );
    }
    const steerText = el("input", { type: "text", id: "steer-text", placeholder: "an instruction the agent takes in at its next boundary", "aria-label": "steering text" });
    const steer = el("button", { type: "button", id: "steer", text: "Steer" });
    steer.addEventListener("click", () => {
      if (steerText.value.trim()) run("steer", { text: steerText.value }, steer);
    });
    const pause = el("button", { type: "button", id: "pause", text: "Pause" });
    pause.addEventListener("click", () => run("pause", {}, pause));
    const resume = el("button", { type: "button", id: "resume", text: "Resume", disabled: s.lifecycle === "running" });
    resume.addEventListener("click", () => run("resume", {}, resume));
    card.appendChild(el("div", { class: "control-row" }, steerText, steer));
    card.appendChild(el("div", { class: "control-row" }, pause, " ", resume, el("span", { class: "muted small", text: " Resume runs qitos sessions resume in a new process (the viewer itself never imports the agent)." })));
    card.appendChild(answer);
    return card;
  }

  function sessionPage(token, sessionId) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading session…" }));
    let watchUntil = 0; // after a control action, follow the session for a while (a resumed run starts)
    const load = async (afterAction) => {
      if (afterAction === true) {
        watchUntil = Date.now() + 30000;
        stopPolling();
      }
      try {
        const d = await api(`/sessions/${encodeURIComponent(sessionId)}`);
        if (token !== routeToken) return;
        clear(app);
        const s = d.session;
        const ins = d.inspection;
        // A run links to its page only when its trace is in this viewer's trace directory.
        const traced = new Set(d.traced_runs || []);
        const runRef = (runId, n) =>
          traced.has(runId)
            ? el("a", { href: `#/runs/${encodeURIComponent(runId)}`, class: "mono", text: n ? short(runId, n) : runId })
            : el("span", { class: "mono muted", text: n ? short(runId, n) : runId || "–", title: "no trace of this run in the viewer's trace directory" });
        app.appendChild(el("p", { class: "crumbs" }, el("a", { href: "#/", text: "Board" }), " / session"));
        app.appendChild(el("div", { class: "title-row" }, el("h1", { class: "mono", text: s.session_id }), badge(s.lifecycle), badge(d.integrity === "verified" ? "verified" : "corrupt", d.integrity === "verified" ? "b-completed" : "b-failed")));
        app.appendChild(
          section(
            "Session",
            kv([
              ["task", s.task],
              ["agent", s.agent],
              ["head snapshot", el("span", { class: "mono small", text: s.snapshot_id })],
              ["sequence", fmtNumber(s.sequence)],
              ["created", fmtTime(s.created_at)],
              ["updated", fmtTime(s.updated_at)],
              ["integrity", d.integrity === "verified" ? "verified" : el("span", { class: "error", text: d.integrity })],
              ins ? ["capabilities", el("span", null, ins.capabilities.map((c) => el("span", { class: "chip", text: c })))] : null,
            ]),
            d.inspection_error ? el("p", { class: "notice", text: `Inspection unavailable: ${d.inspection_error}` }) : null
          )
        );
        app.appendChild(controlsCard(s, ins, load));
        app.appendChild(section("Lineage", el("ul", { class: "tree" }, lineageNode(d.lineage))));
        if (ins) {
          const budget = ins.budget || {};
          app.appendChild(
            section(
              "Budget",
              kv([
                ["used", pre(budget.used || {})],
                ["limits", pre(budget.limits || {})],
                ["durability", pre(budget.durability || {})],
              ])
            )
          );
          if (ins.tool_batch) {
            app.appendChild(
              section(
                `Tool batch of step ${ins.tool_batch.step_id}`,
                el(
                  "table",
                  { class: "grid" },
                  el("thead", null, el("tr", null, ["call", "tool", "args", "status", "error"].map((h) => el("th", { text: h })))),
                  el("tbody", null, ins.tool_batch.calls.map((c) => el("tr", null, el("td", { class: "mono small", text: c.call_id }), el("td", { class: "mono", text: c.tool }), el("td", null, longText(c.args, "code small")), el("td", null, badge(c.status)), el("td", { class: "error small", text: c.error || "" }))))
                ),
                ins.tool_batch.calls.some((c) => c.status === "awaiting_approval") ? el("p", { class: "small muted", text: "Answer the calls awaiting approval under Controls above." }) : null
              )
            );
          }
          const steps = (ins.work_graph || {}).steps || [];
          app.appendChild(
            section(
              `Work graph (${steps.length} step${steps.length === 1 ? "" : "s"})`,
              steps.length
                ? el(
                    "table",
                    { class: "grid" },
                    el("thead", null, el("tr", null, ["step", "mode", "attempts", "tool calls"].map((h) => el("th", { text: h })))),
                    el(
                      "tbody",
                      null,
                      steps.map((w) =>
                        el(
                          "tr",
                          null,
                          el("td", { class: "mono", text: w.work_item }),
                          el("td", null, w.mode ? badge(w.mode, "b-mode") : "–"),
                          el("td", null, (w.attempts || []).map((a) => el("div", { class: "small" }, badge(a.outcome), " ", runRef(a.run_id, 16), " ", el("span", { class: "mono muted", text: short(a.snapshot_id, 14), title: a.snapshot_id })))),
                          el("td", null, (w.tool_calls || []).map((c) => el("div", { class: "small" }, el("span", { class: "mono", text: c.tool }), " ", badge(c.outcome, c.outcome === "ok" ? "b-completed" : "b-failed"))))
                        )
                      )
                    )
                  )
                : el("p", { class: "muted small", text: "no committed step yet" })
            )
          );
          if (ins.last_request_view) {
            app.appendChild(el("h2", { class: "section-title", text: "Last request" }));
            app.appendChild(requestView(ins.last_request_view));
            if (ins.last_request_messages) app.appendChild(messagesSection(ins.last_request_messages));
          }
        }
        app.appendChild(
          section(
            `Snapshots (${fmtNumber(d.snapshot_count)}, newest first)`,
            el("ol", { class: "snapshots mono small" }, d.snapshots.map((id) => el("li", { text: id }))),
            d.snapshot_count > d.snapshots.length ? el("p", { class: "muted small", text: `… and ${d.snapshot_count - d.snapshots.length} older` }) : null
          )
        );
        if (d.runs.length) app.appendChild(section("Runs", el("ul", null, d.runs.map((r) => el("li", null, runRef(r))))));
        const live = s.lifecycle === "running" || Date.now() < watchUntil;
        if (live) schedule(token, load, POLL_LIVE_MS, true);
        else liveBadge.hidden = true;
      } catch (error) {
        if (token === routeToken) showError(error);
      }
    };
    load();
  }

  // ------------------------------------------------------------------ eval pages

  function fmtScore(v) {
    if (v === null || v === undefined) return "–";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toFixed(3);
    return String(v);
  }

  function fmtCi(ci) {
    return ci ? `[${fmtScore(ci[0])}, ${fmtScore(ci[1])}]` : "–";
  }

  function scoreCell(entry) {
    if (!entry) return el("td", { class: "muted", text: "–" });
    if (entry.error) return el("td", { class: "error small", title: entry.error, text: "error" });
    const v = entry.value;
    const cls = v === true || v === 1 || v === "C" ? "pass" : v === false || v === 0 || v === "I" ? "fail" : null;
    return el("td", { class: cls ? `score ${cls}` : "score", text: fmtScore(v) });
  }

  function sessionLink(sessionId, n) {
    return el("a", { href: `#/sessions/${encodeURIComponent(sessionId)}`, class: "mono", text: short(sessionId, n || 18) });
  }

  function evalsPage(token) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading evals…" }));
    const load = async () => {
      try {
        const data = await api("/evals");
        if (token !== routeToken) return;
        clear(app);
        const box = el("div", { class: "table-wrap", id: "evals-table" });
        app.appendChild(el("div", null, el("div", { class: "toolbar" }, el("h1", { text: "Evals" })), el("p", { class: "muted small", text: data.db ? `Store: ${data.db}` : "" }), el("section", { class: "card" }, box)));
        if (!data.available) {
          box.appendChild(el("p", { class: "muted", text: data.db ? `No session store at ${data.db}.` : "No session store configured: start the viewer with --db naming one." }));
          return;
        }
        if (!data.evals.length) {
          box.appendChild(el("p", { class: "muted", text: "No evals in this store yet (qitos eval run ... --db naming it)." }));
          return;
        }
        box.appendChild(
          el(
            "table",
            { class: "grid" },
            el("thead", null, el("tr", null, ["Eval", "Status", "Dataset", "Agent", "Model", "Samples", "Scores", "Created"].map((h) => el("th", { text: h })))),
            el(
              "tbody",
              null,
              data.evals.map((e) =>
                el(
                  "tr",
                  { dataset: { eval: e.name } },
                  el("td", null, el("a", { href: `#/evals/${encodeURIComponent(e.name)}`, text: e.name })),
                  el("td", null, badge(e.status)),
                  el("td", { text: e.dataset || "–" }),
                  el("td", { class: "mono small", text: e.agent || "–" }),
                  el("td", { class: "mono small", text: e.model || "–" }),
                  el("td", { class: "num done", text: `${e.done}/${e.total}` }),
                  el("td", { class: "small" }, Object.entries(e.scorers).map(([k, m]) => el("div", { text: `${k} ${fmtScore(m.mean)} ${fmtCi(m.ci95)}` }))),
                  el("td", { class: "small", text: fmtTime(e.created_at) })
                )
              )
            )
          )
        );
        const live = data.evals.some((e) => e.status === "running");
        schedule(token, load, live ? POLL_LIVE_MS : POLL_BOARD_MS, live);
      } catch (error) {
        if (token === routeToken) showError(error);
      }
    };
    load();
  }

  const evalFilters = { score: "", error: "", group: "", groupValue: "", diverged: false };

  function histogram(bins) {
    const most = Math.max(1, ...bins.map((b) => b.count));
    return el(
      "div",
      { class: "hist" },
      bins.map((b) =>
        el(
          "div",
          { class: "hist-row", dataset: { label: b.label } },
          el("span", { class: "hist-label small", text: b.label }),
          el("span", { class: "hist-bar", style: { width: `${Math.round((b.count / most) * 100)}%` } }),
          el("span", { class: "hist-count small", text: fmtNumber(b.count) })
        )
      )
    );
  }

  function evalPage(token, ref) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading eval…" }));
    let others = [];
    const load = async () => {
      try {
        const [data, list] = await Promise.all([api(`/evals/${encodeURIComponent(ref)}`), others.length ? Promise.resolve(null) : api("/evals")]);
        if (token !== routeToken) return;
        if (list) others = list.evals.filter((e) => e.name !== data.eval.name);
        render(data);
        const live = data.eval.status === "running";
        schedule(token, load, live ? POLL_LIVE_MS : POLL_BOARD_MS * 2, live);
      } catch (error) {
        if (token === routeToken) showError(error);
      }
    };
    const render = (data) => {
      const ev = data.eval;
      const scorers = Object.keys(ev.metrics);
      clear(app);
      const scoreTable = el(
        "table",
        { class: "grid", id: "score-table" },
        el("thead", null, el("tr", null, ["Scorer", "Mean", "Std. error", "95% CI", "n", "Errors", "Reducer"].map((h) => el("th", { text: h })))),
        el(
          "tbody",
          null,
          scorers.map((k) => {
            const m = ev.metrics[k];
            return el("tr", { dataset: { scorer: k } }, el("td", { text: k }), el("td", { class: "num mean", text: fmtScore(m.mean) }), el("td", { class: "num", text: fmtScore(m.stderr) }), el("td", { class: "num", text: fmtCi(m.ci95) }), el("td", { class: "num", text: fmtNumber(m.n) }), el("td", { class: "num", text: fmtNumber(m.errors) }), el("td", { text: m.reducer }));
          })
        )
      );
      const first = scorers[0];
      const scoreSelect = el("select", { id: "score-filter", "aria-label": "score" }, [["", "any score"], ["pass", `${first || "score"} passed`], ["fail", `${first || "score"} failed`]].map(([v, t]) => el("option", { value: v, text: t })));
      scoreSelect.value = evalFilters.score;
      const errorSelect = el("select", { id: "error-filter", "aria-label": "errors" }, [["", "errors or not"], ["yes", "with an error"], ["no", "without an error"]].map(([v, t]) => el("option", { value: v, text: t })));
      errorSelect.value = evalFilters.error;
      const groupKeys = Object.keys(data.groups);
      const groupSelect = el("select", { id: "group-filter", "aria-label": "metadata field" }, el("option", { value: "", text: "any metadata" }), groupKeys.map((k) => el("option", { value: k, text: k })));
      groupSelect.value = evalFilters.group;
      const valueSelect = el("select", { id: "group-value", "aria-label": "metadata value" });
      const fillValues = () => {
        clear(valueSelect);
        valueSelect.appendChild(el("option", { value: "", text: "any value" }));
        for (const v of data.groups[evalFilters.group] || []) valueSelect.appendChild(el("option", { value: v, text: v }));
        valueSelect.value = evalFilters.groupValue;
        valueSelect.hidden = !evalFilters.group;
      };
      fillValues();
      const divergedBox = el("input", { type: "checkbox", id: "diverged-filter", checked: evalFilters.diverged });
      const samplesBox = el("div", { class: "table-wrap", id: "samples-table" });
      const passed = (s) => {
        const entry = s.scores[first];
        if (!entry || entry.error) return null;
        return entry.value === true || entry.value === 1 || entry.value === "C";
      };
      const renderSamples = () => {
        clear(samplesBox);
        const rows = data.samples.filter((s) => {
          if (evalFilters.score && passed(s) !== (evalFilters.score === "pass")) return false;
          if (evalFilters.error === "yes" && !s.error) return false;
          if (evalFilters.error === "no" && s.error) return false;
          if (evalFilters.group && evalFilters.groupValue && String(s.metadata[evalFilters.group]) !== evalFilters.groupValue) return false;
          if (evalFilters.diverged && !s.divergence) return false;
          return true;
        });
        samplesBox.appendChild(
          el(
            "table",
            { class: "grid" },
            el("thead", null, el("tr", null, ["Sample", "Epoch", ...scorers, "Answer", "Steps", "Tokens", "Time", "Error", "Session", "Request"].map((h) => el("th", { text: h })))),
            el(
              "tbody",
              null,
              rows.map((s) =>
                el(
                  "tr",
                  { class: s.divergence ? "diverged" : null, dataset: { sample: s.id, epoch: String(s.epoch) } },
                  el("td", { class: "mono", text: s.id }),
                  el("td", { class: "num", text: s.epoch }),
                  scorers.map((k) => scoreCell(s.scores[k])),
                  el("td", { class: "task", title: s.answer === null ? "" : String(s.answer), text: s.answer === null ? "–" : String(s.answer) }),
                  el("td", { class: "num", text: fmtNumber(s.steps) }),
                  el("td", { class: "num", text: fmtNumber(s.total_tokens) }),
                  el("td", { class: "num", text: fmtDuration(s.wall_seconds) }),
                  el("td", { class: "error small", text: s.error || "" }, s.divergence ? el("div", { class: "muted", text: `diverged at step ${s.divergence.step}: ${Object.keys(s.divergence.diff || {}).join(", ") || "the request"} changed` }) : null),
                  el("td", null, sessionLink(s.session_id)),
                  el("td", null, el("a", { class: "request-link", href: `#/sessions/${encodeURIComponent(s.session_id)}/steps/${s.request_step}/request`, text: `step ${s.request_step}` }))
                )
              )
            )
          )
        );
        samplesBox.appendChild(el("p", { class: "muted small", id: "samples-count", text: `${rows.length} of ${data.samples.length} sample x epoch rows` }));
      };
      const onChange = () => {
        evalFilters.score = scoreSelect.value;
        evalFilters.error = errorSelect.value;
        if (evalFilters.group !== groupSelect.value) evalFilters.groupValue = "";
        evalFilters.group = groupSelect.value;
        evalFilters.groupValue = evalFilters.group ? valueSelect.value : "";
        evalFilters.diverged = divergedBox.checked;
        fillValues();
        renderSamples();
      };
      for (const control of [scoreSelect, errorSelect, groupSelect, valueSelect, divergedBox]) control.addEventListener("change", onChange);
      const compareSelect = el("select", { id: "compare-with", "aria-label": "compare with" }, el("option", { value: "", text: "compare with…" }), others.map((e) => el("option", { value: e.name, text: e.name })));
      compareSelect.addEventListener("change", () => {
        if (compareSelect.value) location.hash = `#/evals/${encodeURIComponent(compareSelect.value)}/compare/${encodeURIComponent(ev.name)}`;
      });
      const total = ev.total_samples * ev.epochs;
      app.appendChild(
        el(
          "div",
          null,
          el("p", { class: "crumbs" }, el("a", { href: "#/evals", text: "Evals" }), ` / ${ev.name}`),
          el("div", { class: "title-row" }, el("h1", { text: `Eval ${ev.name}` }), badge(ev.status), el("span", { class: "pager" }, compareSelect)),
          section(
            "Eval",
            kv([
              ["eval id", el("span", { class: "mono small", text: ev.eval_id })],
              ["dataset", `${(ev.pins.dataset || {}).name || "–"} (${ev.total_samples} samples, digest ${short((ev.pins.dataset || {}).digest, 12)})`],
              ["agent", el("span", { class: "mono small", text: ev.pins.agent || "–" })],
              ["model", el("span", { class: "mono small", text: ev.model || "–" })],
              ["progress", el("span", { id: "progress", text: `${ev.samples.length}/${total} done · ${ev.failed} failed · ${ev.retried} retried` })],
              ["tokens", fmtNumber(ev.total_tokens)],
              ["sample time", fmtDuration(ev.wall_seconds)],
              ev.pins.replay ? ["replayed from", el("span", { class: "mono small", text: `${ev.pins.replay.eval_id} (on divergence: ${ev.pins.replay.on_divergence})` })] : null,
            ])
          ),
          section("Scores", scoreTable),
          section("Score histograms", el("div", { class: "columns" }, scorers.map((k) => el("div", { dataset: { histogram: k } }, el("h3", { text: k }), data.histograms[k].length ? histogram(data.histograms[k]) : el("p", { class: "muted small", text: "no scores yet" }))))),
          section("Samples", el("div", { class: "toolbar" }, scoreSelect, errorSelect, groupSelect, valueSelect, el("label", { class: "small" }, divergedBox, " diverged only")), samplesBox)
        )
      );
      renderSamples();
    };
    load();
  }

  function comparePage(token, a, bAndQuery) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Comparing…" }));
    const [b, query] = bAndQuery.split("?");
    const allow = new URLSearchParams(query || "").get("allow") === "1";
    const base = `/evals/${encodeURIComponent(a)}/compare/${encodeURIComponent(b)}`;
    api(base + (allow ? "?allow_different_datasets=1" : ""))
      .then((data) => {
        if (token !== routeToken) return;
        clear(app);
        const c = data.comparison;
        const scorers = Object.keys(c.scorers);
        const flipLink = (f) =>
          el("li", { class: `flip ${f.kind}`, dataset: { sample: f.id } }, el("span", { class: "mono", text: f.id }), ` ${f.kind === "pass_to_fail" ? "pass → fail" : "fail → pass"} (${f.scorer}) · A `, f.a_sessions.map((sid) => sessionLink(sid, 14)), " · B ", f.b_sessions.map((sid) => sessionLink(sid, 14)));
        const flips = [];
        for (const k of scorers) for (const kind of ["pass_to_fail", "fail_to_pass"]) for (const f of c.scorers[k].flips[kind]) flips.push({ ...f, kind, scorer: k });
        app.appendChild(
          el(
            "div",
            null,
            el("p", { class: "crumbs" }, el("a", { href: "#/evals", text: "Evals" }), " / ", el("a", { href: `#/evals/${encodeURIComponent(c.a.name)}`, text: c.a.name }), " vs ", el("a", { href: `#/evals/${encodeURIComponent(c.b.name)}`, text: c.b.name })),
            el("h1", { text: `${c.b.name} (B) against ${c.a.name} (A)` }),
            c.same_dataset ? null : el("p", { class: "notice", text: `Different datasets: only the ${c.paired.length} samples both have are paired.` }),
            section(
              "Paired statistics",
              el(
                "table",
                { class: "grid", id: "paired-table" },
                el("thead", null, el("tr", null, ["Scorer", "n", "A", "B", "B − A", "95% CI (paired bootstrap)", "McNemar p", "pass → fail", "fail → pass"].map((h) => el("th", { text: h })))),
                el(
                  "tbody",
                  null,
                  scorers.map((k) => {
                    const s = c.scorers[k];
                    return el("tr", { dataset: { scorer: k } }, el("td", { text: k }), el("td", { class: "num", text: fmtNumber(s.n) }), el("td", { class: "num", text: fmtScore(s.mean_a) }), el("td", { class: "num", text: fmtScore(s.mean_b) }), el("td", { class: "num difference", text: s.difference === null ? "–" : (s.difference >= 0 ? "+" : "") + fmtScore(s.difference) }), el("td", { class: "num", text: fmtCi(s.ci95) }), el("td", { class: "num p-value", text: s.mcnemar ? s.mcnemar.p_value.toPrecision(4) : "–" }), el("td", { class: "num", text: s.mcnemar ? String(s.mcnemar.a_only) : "–" }), el("td", { class: "num", text: s.mcnemar ? String(s.mcnemar.b_only) : "–" }));
                  })
                )
              ),
              kv([
                ["tokens", `A ${fmtNumber(c.tokens.a)} · B ${fmtNumber(c.tokens.b)} · B − A ${fmtNumber(c.tokens.difference)}`],
                ["sample time", `A ${fmtDuration(c.wall_seconds.a)} · B ${fmtDuration(c.wall_seconds.b)}`],
                c.only_a.length ? ["only in A", c.only_a.join(", ")] : null,
                c.only_b.length ? ["only in B", c.only_b.join(", ")] : null,
              ])
            ),
            section(`Flips (${flips.length})`, flips.length ? el("ul", { class: "flips", id: "flips" }, flips.map(flipLink)) : el("p", { class: "muted", text: "No sample flipped." })),
            section(
              "Samples side by side",
              el(
                "table",
                { class: "grid", id: "side-by-side" },
                el("thead", null, el("tr", null, ["Sample", ...scorers.map((k) => `A ${k}`), ...scorers.map((k) => `B ${k}`), "A answer", "B answer"].map((h) => el("th", { text: h })))),
                el(
                  "tbody",
                  null,
                  data.rows.map((r) => {
                    const kinds = Object.values(r.flip);
                    const cls = kinds.includes("pass_to_fail") ? "flip pass_to_fail" : kinds.includes("fail_to_pass") ? "flip fail_to_pass" : null;
                    const one = (runs, k) => scoreCell(runs.length ? runs[0].scores[k] : null);
                    return el("tr", { class: cls, dataset: { sample: r.id } }, el("td", { class: "mono", text: r.id }), scorers.map((k) => one(r.a, k)), scorers.map((k) => one(r.b, k)), el("td", { class: "task", text: r.a.length ? String(r.a[0].answer ?? "–") : "(not in A)" }), el("td", { class: "task", text: r.b.length ? String(r.b[0].answer ?? "–") : "(not in B)" }));
                  })
                )
              )
            )
          )
        );
      })
      .catch((error) => {
        if (token !== routeToken) return;
        if (error.status === 400 && /different datasets/.test(error.message) && !allow) {
          clear(app);
          app.appendChild(el("div", { class: "card error-card" }, el("h1", { text: "Different datasets" }), el("p", { class: "error", text: error.message }), el("p", null, el("a", { id: "allow-different", href: `#/evals/${encodeURIComponent(a)}/compare/${encodeURIComponent(b)}?allow=1`, text: "Compare the shared samples anyway" }))));
          return;
        }
        showError(error);
      });
  }

  function sessionRequestPage(token, sessionId, stepId) {
    clear(app);
    app.appendChild(el("p", { class: "muted", text: "Loading request…" }));
    const link = `#/sessions/${encodeURIComponent(sessionId)}`;
    api(`/sessions/${encodeURIComponent(sessionId)}/steps/${stepId}/request`)
      .then((request) => {
        if (token !== routeToken) return;
        clear(app);
        const steps = request.model_steps || [];
        const index = steps.indexOf(stepId);
        const prev = index > 0 ? steps[index - 1] : null;
        const next = index >= 0 && index < steps.length - 1 ? steps[index + 1] : null;
        const response = (request.model || {}).response || {};
        app.appendChild(
          el(
            "div",
            null,
            el("p", { class: "crumbs" }, el("a", { href: "#/", text: "Board" }), " / ", el("a", { href: link, class: "mono", text: short(sessionId, 22) }), ` / step ${stepId} / request`),
            el("div", { class: "title-row" }, el("h1", { text: `Request inspector · step ${stepId}` }), el("span", { class: "pager" }, prev !== null ? el("a", { href: `${link}/steps/${prev}/request`, text: `← step ${prev}` }) : null, next !== null ? el("a", { href: `${link}/steps/${next}/request`, text: `step ${next} →` }) : null))
          )
        );
        if (request.request_view) app.appendChild(requestView(request.request_view));
        app.appendChild(messagesSection(request.messages));
        app.appendChild(
          section(
            "Model reply",
            kv([
              ["model", response.model || "–"],
              ["finish", response.finish_reason || "–"],
              ["served from", el("span", { id: "served-from", text: response.served_from || "the model" })],
              ["usage", `${fmtNumber((response.usage || {}).input_tokens)} in · ${fmtNumber((response.usage || {}).output_tokens)} out`],
              ["request digest", el("span", { class: "mono small", text: request.model.request_digest || "–" })],
            ]),
            response.text ? longText(response.text, "answer") : null,
            response.tool_calls && response.tool_calls.length ? pre(response.tool_calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments ?? c.raw_arguments }))) : null
          )
        );
      })
      .catch((error) => {
        if (token === routeToken) showError(error);
      });
  }

  route();
})();
