// The operations page of sandhold serve: polls the REST API every 2 s with the key the operator
// typed (kept in this tab's sessionStorage only) and calls the tool routes for kill, pause and
// resume. Every value from the server is put into the page with textContent: task names, and
// tool and operation names in audit records, are whatever a tenant sent. The page's Content
// Security Policy (Trusted Types) makes any HTML sink refuse a string, so a slip would fail loudly.
"use strict";

(() => {
  const KEY_ITEM = "sandhold.apiKey";
  const POLL_MS = 2000;
  const AUDIT_LIMIT = 50;
  const SESSION_COLUMNS = ["session_id", "tenant", "task", "policy", "age", "cpu", "memory", "state"];
  const DASH = "\u2013";

  const byId = (id) => document.getElementById(id);
  // Session id -> its row and the cells and buttons in it; rows are updated in place, so a
  // button is never replaced between the press and the release of a click.
  const rows = new Map();
  // Bumped whenever the key changes: answers to requests made with the old key are dropped.
  let generation = 0;
  let timer = null;

  class ApiError extends Error {
    constructor(status, body) {
      const type = (body && body.error_type) || `http_${status}`;
      super(`${type}: ${(body && body.error_message) || `HTTP ${status}`}`);
      this.status = status;
      this.errorType = type;
    }
  }

  function storedKey() {
    try {
      return sessionStorage.getItem(KEY_ITEM);
    } catch (_) {
      return null;
    }
  }

  async function api(method, path, body) {
    const key = storedKey();
    if (!key) throw new ApiError(401, { error_type: "unauthenticated", error_message: "no key" });
    const init = {
      method,
      headers: { Authorization: `Bearer ${key}` },
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
      referrerPolicy: "no-referrer",
    };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    let answer = null;
    try {
      answer = await response.json();
    } catch (_) {
      answer = null;
    }
    if (!response.ok || !answer || answer.success !== true) throw new ApiError(response.status, answer);
    return answer;
  }

  function say(text, kind = "") {
    const status = byId("status");
    status.textContent = text;
    status.dataset.kind = kind;
  }

  function text(value) {
    return value === null || value === undefined || value === "" ? DASH : String(value);
  }

  function age(seconds) {
    if (typeof seconds !== "number") return DASH;
    if (seconds < 120) return `${Math.round(seconds)}s`;
    if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
    return `${(seconds / 3600).toFixed(1)}h`;
  }

  function cpu(percent) {
    return typeof percent === "number" ? `${percent.toFixed(1)}%` : DASH;
  }

  function memory(used, limit) {
    if (typeof used !== "number") return DASH;
    return typeof limit === "number" && limit > 0 ? `${used.toFixed(1)} / ${Math.round(limit)} MiB` : `${used.toFixed(1)} MiB`;
  }

  function cell(tag, value, className) {
    const element = document.createElement(tag);
    element.textContent = value;
    if (className) element.className = className;
    return element;
  }

  function makeRow(sessionId) {
    const row = document.createElement("tr");
    row.dataset.sessionId = sessionId;
    const cells = {};
    for (const name of SESSION_COLUMNS) {
      cells[name] = cell("td", "", `col-${name}`);
      row.append(cells[name]);
    }
    const actions = cell("td", "", "col-actions");
    const pause = cell("button", "Pause", "pause");
    const kill = cell("button", "Kill", "kill");
    pause.type = kill.type = "button";
    pause.addEventListener("click", () => togglePause(sessionId, pause));
    kill.addEventListener("click", () => killSession(sessionId, kill));
    actions.append(pause, kill);
    row.append(actions);
    return { row, cells, pause, kill };
  }

  function renderSessions(answer) {
    const body = byId("sessions").tBodies[0];
    const seen = new Set();
    for (const session of answer.sessions) {
      const id = String(session.session_id);
      seen.add(id);
      let entry = rows.get(id);
      if (!entry) {
        entry = makeRow(id);
        rows.set(id, entry);
        body.append(entry.row);
      }
      const values = {
        session_id: id,
        tenant: text(session.tenant),
        task: text(session.task),
        policy: text(session.policy),
        age: age(session.age_s),
        cpu: cpu(session.cpu_percent),
        memory: memory(session.memory_mb, session.memory_limit_mb),
        state: text(session.state),
      };
      for (const name of SESSION_COLUMNS) entry.cells[name].textContent = values[name];
      const paused = session.state === "paused";
      entry.row.dataset.state = String(session.state);
      if (!entry.pause.disabled) entry.pause.textContent = paused ? "Resume" : "Pause";
      entry.pause.dataset.action = paused ? "resume" : "pause";
    }
    for (const [id, entry] of rows) {
      if (!seen.has(id)) removeRow(id, entry);
    }
    byId("session-count").textContent = `(${answer.count})`;
    byId("no-sessions").hidden = answer.count > 0;
    byId("who").textContent = answer.operator ? "operator: every tenant" : `tenant ${text(answer.tenant)}`;
  }

  function removeRow(id, entry) {
    entry.row.remove();
    rows.delete(id);
  }

  function renderPools(answer) {
    const body = byId("pools").tBodies[0];
    if (answer === null) {
      // A tenant's key: the pools and the server's load are the operator's to see.
      body.replaceChildren();
      byId("no-pools").hidden = true;
      byId("capacity").textContent = "Warm pools and the server's load: an operator's key shows them.";
      return;
    }
    body.replaceChildren(
      ...answer.pools.map((pool) => {
        const row = document.createElement("tr");
        row.append(cell("td", text(pool.policy)), cell("td", text(pool.ready)), cell("td", text(pool.size)));
        return row;
      }),
    );
    byId("no-pools").hidden = answer.pools.length > 0;
    const starting = answer.starting ? `, ${answer.starting} being made` : "";
    byId("capacity").textContent = `${answer.sessions} of at most ${answer.max_sessions} sessions held on this server, all tenants${starting}.`;
  }

  function renderAudit(answer) {
    byId("audit-off").hidden = answer.enabled;
    byId("audit").hidden = !answer.enabled;
    const body = byId("audit").tBodies[0];
    body.replaceChildren(
      ...answer.events.map((event) => {
        const row = document.createElement("tr");
        const when = typeof event.time === "string" ? event.time.replace("T", " ").replace(/\.\d+Z$/, "") : DASH;
        const outcome = event.error_type ? `${text(event.outcome)} (${event.error_type})` : text(event.outcome);
        row.dataset.seq = String(event.seq);
        row.dataset.outcome = String(event.outcome);
        row.append(
          cell("td", when),
          cell("td", text(event.task)),
          cell("td", text(event.tool)),
          cell("td", text(event.operation)),
          cell("td", text(event.session_id)),
          cell("td", outcome),
          cell("td", text(event.duration_ms)),
        );
        return row;
      }),
    );
  }

  async function refresh() {
    const mine = generation;
    try {
      const [sessions, pools, audit] = await Promise.all([
        api("GET", "v1/ops/sessions"),
        api("GET", "v1/ops/pools").catch((error) => {
          if (error.status === 403) return null;
          throw error;
        }),
        api("GET", `v1/ops/audit?limit=${AUDIT_LIMIT}`),
      ]);
      if (mine !== generation) return;
      renderSessions(sessions);
      renderPools(pools);
      renderAudit(audit);
      byId("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshed every ${POLL_MS / 1000} s.`;
      if (byId("status").dataset.kind === "poll") say("");
    } catch (error) {
      if (mine !== generation) return;
      if (error.status === 401) {
        forget("The server refused the key (401 unauthenticated): enter a valid API key.");
        return;
      }
      say(`Refresh failed: ${error.message}`, "poll");
    }
  }

  async function poll() {
    const mine = generation;
    await refresh();
    if (mine === generation && storedKey()) timer = setTimeout(poll, POLL_MS);
  }

  // While a button's call is on its way: a listing taken before it must not be drawn after it.
  function hold() {
    clearTimeout(timer);
    generation += 1;
  }

  function restart() {
    hold();
    poll();
  }

  async function killSession(sessionId, button) {
    if (!window.confirm(`End session ${sessionId} and remove its container?`)) return;
    hold();
    button.disabled = true;
    try {
      await api("DELETE", `v1/sessions/${encodeURIComponent(sessionId)}`);
      const entry = rows.get(sessionId);
      if (entry) removeRow(sessionId, entry);
      say(`Session ${sessionId} ended.`);
    } catch (error) {
      button.disabled = false;
      say(`Kill of ${sessionId} failed: ${error.message}`, "error");
    }
    restart();
  }

  async function togglePause(sessionId, button) {
    const operation = button.dataset.action === "resume" ? "resume" : "pause";
    hold();
    button.disabled = true;
    try {
      await api("POST", "v1/session", { operation, session_id: sessionId });
      say(`Session ${sessionId} ${operation === "pause" ? "paused" : "resumed"}.`);
    } catch (error) {
      say(`${operation} of ${sessionId} failed: ${error.message}`, "error");
    }
    button.disabled = false;
    restart();
  }

  function showDashboard(shown) {
    byId("key-form").hidden = shown;
    byId("dashboard").hidden = !shown;
    byId("forget").hidden = !shown;
  }

  function forget(message = "") {
    try {
      sessionStorage.removeItem(KEY_ITEM);
    } catch (_) {
      // storage refused: nothing was kept
    }
    hold();
    for (const [id, entry] of rows) removeRow(id, entry);
    byId("who").textContent = "";
    showDashboard(false);
    say(message, message ? "error" : "");
    byId("key").focus();
  }

  function start() {
    byId("key-form").addEventListener("submit", (submitted) => {
      submitted.preventDefault();
      const input = byId("key");
      const key = input.value.trim();
      input.value = "";
      if (!key) return;
      try {
        sessionStorage.setItem(KEY_ITEM, key);
      } catch (_) {
        say("This browser refused to keep the key for this tab (sessionStorage).", "error");
        return;
      }
      say("");
      showDashboard(true);
      restart();
    });
    byId("forget").addEventListener("click", () => forget());
    if (storedKey()) {
      showDashboard(true);
      restart();
    } else {
      showDashboard(false);
    }
  }

  start();
})();
