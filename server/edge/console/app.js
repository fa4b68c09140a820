// The console: routing (#/, #/agent/<id>, #/session/<id>?seq=N, #/plugins), the live
// agents list, the session view with its stream, the act form and the plugins table.
import { ApiError, agents, factory, getToken, registry, setToken, stream } from "./api.js";
import { SessionView, approvalOutcome, h, millis } from "./session.js";

const PAGE = 500; // events loaded at once (the tail of a session, then older pages)
const AGENTS_EVERY = 2000;
const PLUGINS_EVERY = 3000;
const RETRY_AFTER = 1000;

const $ = (selector) => document.querySelector(selector);

const STATUS_WORDS = {
  AGENT_STATUS_IDLE: "idle",
  AGENT_STATUS_RUNNING: "running",
  AGENT_STATUS_DISPOSED: "disposed",
};

/**
 * The agent's status as words. There is no "waiting for approval" status: the agent
 * stays RUNNING and lists what waits (Agent.pending_approvals), so it is derived here.
 */
export function statusWord(status, pending = 0) {
  if (pending > 0 && status !== "AGENT_STATUS_DISPOSED") return "waiting for approval";
  return STATUS_WORDS[status] || String(status || "unknown").replace("AGENT_STATUS_", "").toLowerCase().replaceAll("_", " ");
}

// ---- notices -------------------------------------------------------------------------

// A notice belongs to the route it was raised on (the token's, "auth", to every route):
// leaving the route takes it down, and a late answer of a route left says nothing.
let currentRoute = "";

function notify(message, kind = "error", scope = currentRoute) {
  if (scope !== currentRoute) return; // raised for a route the page has left
  const box = $("#notice");
  box.textContent = message;
  box.className = kind;
  box.dataset.route = kind === "auth" ? "" : scope;
  box.hidden = false;
}

function clearNotice(kind) {
  const box = $("#notice");
  if (!kind || box.className === kind) box.hidden = true;
}

function explain(error, what) {
  if (!(error instanceof ApiError)) return `${what} failed: ${error.message || error}`;
  if (error.status === "UNAUTHENTICATED") {
    return `The server refused the token (${error.status}: ${error.message}). ` +
      "Enter the server's token in the Token field above.";
  }
  return `${what} failed: ${error.status}${error.reason ? ` (${error.reason})` : ""}: ${error.message}`;
}

function fail(error, what, scope = currentRoute) {
  notify(explain(error, what), error.status === "UNAUTHENTICATED" ? "auth" : "error", scope);
}

// ---- agents --------------------------------------------------------------------------

let agentsTimer = 0;
const known = new Map(); // agent id -> Agent JSON

async function listAgents() {
  const found = [];
  let pageToken = "";
  do {
    const page = await factory("ListAgents", { pageSize: 100, pageToken });
    found.push(...(page.agents || []));
    pageToken = page.nextPageToken || "";
  } while (pageToken);
  return found;
}

let agentsBusy = false; // one poll at a time: a call during one asks for another after
let agentsAgain = false;

async function refreshAgents() {
  clearTimeout(agentsTimer);
  if (agentsBusy) {
    agentsAgain = true;
    return;
  }
  agentsBusy = true;
  try {
    const list = await listAgents();
    clearNotice("auth");
    known.clear();
    const body = $("#agents tbody");
    const current = session && session.agentId;
    body.replaceChildren(
      ...list.map((agent) => {
        known.set(agent.agentId, agent);
        const options = agent.options || {};
        const created = agent.createTime ? new Date(millis(agent.createTime)).toLocaleString() : "";
        const link = h("a", { href: `#/agent/${encodeURIComponent(agent.agentId)}` }, agent.agentId);
        if (agent.agentId === current) link.setAttribute("aria-current", "page");
        const word = statusWord(agent.status, (agent.pendingApprovals || []).length);
        return h(
          "tr", { "data-agent": agent.agentId },
          h("th", { scope: "row" }, link),
          h("td", { class: `status ${word.replaceAll(" ", "-")}` }, word),
          h("td", {}, `${options.provider || "default"} / ${options.model || "default"}`),
          h("td", {}, h("time", { datetime: agent.createTime || "" }, created)),
        );
      }),
    );
    if (!list.length) body.append(h("tr", {}, h("td", { colspan: 4 }, "No agents yet.")));
    $("#agents-updated").textContent = `(${list.length}, live)`;
    if (session && session.agentId && known.has(session.agentId) && !session.live) {
      session.showStatus(known.get(session.agentId).status); // until its stream says
    }
    if (session && session.agentId && known.has(session.agentId)) {
      showAgentStatus(session.agentId, session.status, session.pending.size); // the live word
    }
  } catch (error) {
    fail(error, "Listing the agents");
  } finally {
    agentsBusy = false;
  }
  agentsTimer = setTimeout(refreshAgents, agentsAgain ? 0 : AGENTS_EVERY);
  agentsAgain = false;
}

$("#create-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const agentId = form.get("id").trim();
  const options = {
    tools: form.get("tools").split(",").map((t) => t.trim()).filter(Boolean),
  };
  const approval = form.get("approval").split(",").map((t) => t.trim()).filter(Boolean);
  if (approval.length) options.approvalRequiredTools = approval;
  if (form.get("provider").trim()) options.provider = form.get("provider").trim();
  if (form.get("model").trim()) options.model = form.get("model").trim();
  const extra = form.get("options").trim();
  if (extra) {
    try {
      options.providerOptions = JSON.parse(extra);
    } catch (error) {
      notify(`Provider options are not valid JSON: ${error.message}`);
      return;
    }
  }
  try {
    await factory("CreateAgent", { agentId, options });
    clearNotice();
    event.target.reset();
    $("#create").open = false;
    location.hash = `#/agent/${encodeURIComponent(agentId)}`;
    refreshAgents();
  } catch (error) {
    fail(error, `Creating agent ${agentId}`);
  }
});

/** A live status change, shown in the agents table before the next poll. */
function showAgentStatus(agentId, status, pending = 0) {
  const cell = document.querySelector(`#agents tr[data-agent="${CSS.escape(agentId)}"] td.status`);
  if (!cell || !status) return;
  const word = statusWord(status, pending);
  cell.textContent = word;
  cell.className = `status ${word.replaceAll(" ", "-")}`;
}

// ---- the session ---------------------------------------------------------------------

let session = null;

class Session {
  constructor({ agentId, sessionId, seq, page }) {
    this.scope = currentRoute; // the route its notices belong to
    this.agentId = agentId || "";
    this.page = page > 0 ? Math.min(page, 5000) : PAGE;
    this.sessionId = sessionId || "";
    this.target = seq || 0;
    this.events = [];
    this.controller = new AbortController();
    this.view = null;
    this.live = false; // whether its stream has told the agent's status yet
    this.status = "";
    this.pending = new Map(); // approval id -> ApprovalRequested, oldest first
    this.refused = new Map(); // approval id -> the server's message for a refused answer
    this.ended = new Set(); // approval ids seen resolved (a late copy of the request stays out)
  }

  close() {
    this.controller.abort();
  }

  get first() {
    return this.events.length ? Number(this.events[0].seq) : 0;
  }

  get last() {
    return this.events.length ? Number(this.events[this.events.length - 1].seq) : 0;
  }

  showStatus(status) {
    this.status = status || this.status;
    const word = statusWord(this.status, this.pending.size);
    $("#session-status").textContent = `Status: ${word}`;
    $("#session-status").dataset.status = word;
    if (this.agentId) showAgentStatus(this.agentId, this.status, this.pending.size);
  }

  async open() {
    const selector = this.agentId ? { agentId: this.agentId } : { sessionId: this.sessionId };
    const found = (await agents("GetSession", selector)).session;
    this.sessionId = found.sessionId;
    this.agentId = this.agentId || found.agentId || "";
    $("#session-title").textContent = this.agentId ? `Agent ${this.agentId}` : `Session ${this.sessionId}`;
    $("#session-id").textContent = `session ${this.sessionId}`;
    $("#session-link").href = `#/session/${encodeURIComponent(this.sessionId)}`;
    $("#act-form").hidden = !this.agentId;
    if (this.agentId && known.has(this.agentId)) this.showStatus(known.get(this.agentId).status);
    else $("#session-status").textContent = this.agentId ? "" : "Status: no live agent";
    this.view = new SessionView($("#turns"), this.sessionId);
    const count = Number(found.eventCount || 0);
    let from = Math.max(1, count - this.page + 1);
    if (this.target) from = Math.min(from, Math.max(1, this.target - 20));
    this.events = await this.list(from, 0);
    this.render();
    if (this.agentId) await this.loadApprovals();
    this.follow();
  }

  /** The pending approvals as the server lists them (on open, and after a refusal). */
  async loadApprovals() {
    let listed;
    try {
      listed = await agents("ListApprovals", { agentId: this.agentId });
    } catch (error) {
      if (error instanceof ApiError && error.status === "NOT_FOUND") listed = {}; // no live agent
      else throw error;
    }
    if (this.controller.signal.aborted) return;
    this.pending = new Map((listed.approvals || []).map((a) => [a.approvalId, a]));
    this.showApprovals();
  }

  approvalRequested(approval, logged = false) {
    if (!approval || !approval.approvalId || this.ended.has(approval.approvalId)) return;
    if (this.pending.has(approval.approvalId) && !logged) return;
    if (!this.pending.has(approval.approvalId)) this.pending.set(approval.approvalId, approval);
    this.showApprovals(); // a logged one again: its entry links to its seq now
  }

  approvalResolved(resolution) {
    if (!resolution || !resolution.approvalId) return;
    this.ended.add(resolution.approvalId);
    if (!this.pending.delete(resolution.approvalId)) return;
    this.refused.delete(resolution.approvalId);
    this.showApprovals();
  }

  /** Render #approvals: one entry per pending approval, with Approve and Reject. */
  showApprovals() {
    const box = $("#approvals");
    const inside = document.activeElement && box.contains(document.activeElement);
    const focused = inside ? document.activeElement.id : "";
    const typed = new Map([...box.querySelectorAll("input.reject-reason")].map((i) => [i.id, i.value]));
    const entries = [...this.pending.values()].map((a) => approvalEntry(this, a));
    box.replaceChildren(
      h("h3", { id: "approvals-title" }, `Waiting for approval (${this.pending.size})`),
      ...entries,
    );
    box.hidden = this.pending.size === 0;
    for (const [id, value] of typed) {
      const input = document.getElementById(id);
      if (input) input.value = value;
    }
    if (inside) {
      // Keep the keyboard where it was; when its entry is gone, the next one or the message box.
      const target = document.getElementById(focused) || box.querySelector("button.approve") || $("#act-text");
      target.focus();
    }
    if (this.status || this.pending.size) this.showStatus(this.status);
  }

  /** Answer an approval: allow once, or reject with an optional reason. */
  async resolve(approvalId, decision, reason) {
    const body = { agentId: this.agentId, approvalId, decision };
    if (reason) body.reason = reason;
    try {
      const answer = await agents("ResolveApproval", body);
      this.refused.delete(approvalId);
      const r = answer.resolution || {};
      notify(`Approval of ${r.toolName || "the tool call"}: ${approvalOutcome(r.outcome)} by ${r.resolvedBy || "api"}.`, "info", this.scope);
      this.approvalResolved({ approvalId });
    } catch (error) {
      const message = error instanceof ApiError
        ? `The server refused the answer: ${error.status}${error.reason ? ` (${error.reason})` : ""}: ${error.message}`
        : `The answer failed: ${error.message || error}`;
      this.refused.set(approvalId, message);
      fail(error, "Answering the approval", this.scope);
      if (error instanceof ApiError && ["NOT_FOUND", "FAILED_PRECONDITION"].includes(error.status)) {
        // Answered, cancelled or timed out meanwhile: show it, then refresh the list.
        this.showApprovals();
        await this.loadApprovals().catch((e) => fail(e, "Listing the approvals", this.scope));
      } else {
        this.showApprovals();
      }
    }
  }

  async list(from, until) {
    const events = [];
    let pageToken = "";
    do {
      const size = until ? Math.min(5000, until - from - events.length) : 1000;
      if (size <= 0) break;
      const page = await agents("ListSessionEvents", { sessionId: this.sessionId, fromSeq: from, pageSize: size, pageToken });
      events.push(...(page.events || []));
      pageToken = page.nextPageToken || "";
    } while (pageToken && !this.controller.signal.aborted);
    return until ? events.filter((e) => Number(e.seq) < until) : events;
  }

  render() {
    this.view.reset();
    for (const event of this.events) this.view.apply(event);
    this.view.fold(3, this.target);
    $("#load-older").hidden = this.first <= 1;
    if (this.target) {
      const node = document.querySelector(`#turns [data-seq="${this.target}"]`);
      if (node) {
        node.classList.add("target");
        node.setAttribute("tabindex", "-1");
        node.scrollIntoView({ block: "center" });
        node.focus({ preventScroll: true });
      }
    }
  }

  async older() {
    const before = this.first;
    const from = Math.max(1, before - this.page);
    const older = await this.list(from, before);
    this.events = [...older, ...this.events];
    this.target = 0;
    this.render();
    const node = document.querySelector(`#turns [data-seq="${before}"]`);
    if (node) node.scrollIntoView({ block: "start" });
  }

  /** Follow the session live from one past the last event, reconnecting on a break. */
  async follow() {
    const signal = this.controller.signal;
    let byAgent = Boolean(this.agentId); // by agent: its live status events come too
    while (!signal.aborted) {
      const request = byAgent
        ? { agentId: this.agentId, fromSeq: this.last + 1 }
        : { sessionId: this.sessionId, fromSeq: this.last + 1 };
      try {
        await stream(request, (response) => this.receive(response), signal);
      } catch (error) {
        if (signal.aborted) return;
        if (byAgent && error instanceof ApiError && error.status === "NOT_FOUND") {
          byAgent = false; // the agent is gone: follow the session itself
          continue;
        }
        if (error instanceof ApiError) {
          fail(error, "Following the session", this.scope);
          if (["UNAUTHENTICATED", "NOT_FOUND", "INVALID_ARGUMENT"].includes(error.status)) return;
        }
      }
      if (signal.aborted) return;
      await new Promise((resolve) => setTimeout(resolve, RETRY_AFTER));
    }
  }

  // Approvals: the session events render in SessionView (on_approvalRequested,
  // on_approvalResolved) where they landed; the pending ones (ListApprovals on open, then
  // these events and the live agent events) render into #approvals.
  receive(response) {
    for (const event of response.events || []) {
      if (Number(event.seq) <= this.last) continue; // already shown (a reconnect's replay)
      this.events.push(event);
      this.view.apply(event);
      if (this.agentId && event.approvalRequested) this.approvalRequested(event.approvalRequested, true);
      if (event.approvalResolved) this.approvalResolved(event.approvalResolved);
    }
    for (const event of response.agentEvents || []) {
      if (event.approvalRequested) this.approvalRequested(event.approvalRequested);
      if (event.approvalResolved) this.approvalResolved(event.approvalResolved);
      if (event.status) {
        this.live = true;
        this.showStatus(event.status.status);
        showAgentStatus(this.agentId, event.status.status);
      }
      if (event.disposed) {
        this.pending.clear();
        this.showApprovals();
        this.showStatus("AGENT_STATUS_DISPOSED");
      }
      if (event.error) notify(`Agent ${this.agentId}: ${event.error.message}`, "agent", this.scope);
    }
  }
}

/** One pending approval: what waits, who asked, until when; Approve and Reject. */
function approvalEntry(owner, a) {
  const id = a.approvalId;
  const key = id.replace(/[^A-Za-z0-9_-]/g, "_");
  const expires = a.expireTime ? new Date(millis(a.expireTime)) : null;
  const reason = h("input", { id: `reject-reason-${key}`, class: "reject-reason", type: "text", maxlength: 4096, autocomplete: "off" });
  const approve = h("button", { type: "button", class: "approve", id: `approve-${key}` }, "Approve (allow once)");
  const reject = h("button", { type: "button", class: "reject", id: `reject-${key}` }, "Reject");
  const busy = (on) => { approve.disabled = on; reject.disabled = on; };
  approve.addEventListener("click", async () => {
    busy(true);
    await owner.resolve(id, "APPROVAL_DECISION_ALLOW_ONCE", "");
    busy(false);
  });
  reject.addEventListener("click", async () => {
    busy(true);
    await owner.resolve(id, "APPROVAL_DECISION_REJECT", reason.value.trim());
    busy(false);
  });
  reason.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      reject.click();
    }
  });
  const where = h("a", { href: `#/session/${encodeURIComponent(owner.sessionId)}` }, `turn ${a.turn || "?"}, step ${a.step || "?"}`);
  const requested = owner.events.find((e) => e.approvalRequested && e.approvalRequested.approvalId === id);
  if (requested) where.href = `#/session/${encodeURIComponent(owner.sessionId)}?seq=${requested.seq}`;
  const refusal = owner.refused.get(id);
  return h(
    "article", { class: "approval", "data-approval": id, "aria-labelledby": `approval-title-${key}` },
    h("h4", { id: `approval-title-${key}` }, "Tool ", h("code", { class: "approval-tool" }, a.toolName || "?"), " waits for approval"),
    h("dl", {},
      h("dt", {}, "Arguments"), h("dd", {}, h("pre", { class: "approval-args" }, prettyJson(a.arguments))),
      h("dt", {}, "Reason"), h("dd", { class: "approval-reason" }, a.reason || "none given"),
      h("dt", {}, "Asked by"), h("dd", { class: "approval-by" }, a.requestedBy || "unknown"),
      h("dt", {}, "Expires"), h("dd", {}, expires ? h("time", { datetime: a.expireTime }, expires.toLocaleString()) : "never"),
      h("dt", {}, "Where"), h("dd", {}, where, ` · call ${a.callId || "?"}`),
    ),
    refusal ? h("p", { class: "refusal", role: "alert" }, refusal) : null,
    h("div", { class: "buttons" },
      approve,
      h("label", { for: `reject-reason-${key}` }, "Rejection reason (optional)"),
      reason,
      reject,
    ),
  );
}

function prettyJson(text) {
  if (!text) return "";
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

$("#load-older").addEventListener("click", () => session && session.older().catch((e) => fail(e, "Loading older events")));

$("#act-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  if (!session || !session.agentId) return;
  const action = event.submitter ? event.submitter.value : "send";
  const text = $("#act-text").value;
  const agentId = session.agentId;
  const calls = {
    send: () => agents("SendMessage", { agentId, text }),
    steer: () => agents("SteerMessage", { agentId, text }),
    inject: () => agents("InjectContext", { agentId, text }),
  };
  try {
    const answer = await calls[action]();
    clearNotice();
    // Clear only what was sent: the person may have typed the next message meanwhile.
    if ($("#act-text").value === text) $("#act-text").value = "";
    if (action === "steer" && answer.steering === false) {
      notify("No turn was running: the steering message was queued as a message.", "info");
    }
  } catch (error) {
    fail(error, `${action[0].toUpperCase()}${action.slice(1)}`);
  }
});

$("#cancel-turn").addEventListener("click", async () => {
  if (!session || !session.agentId) return;
  try {
    const answer = await agents("CancelTurn", { agentId: session.agentId, reason: "cancelled from the console" });
    notify(answer.cancelled ? "Turn cancelled." : "No turn was running.", "info");
  } catch (error) {
    fail(error, "Cancel");
  }
});

// ---- plugins -------------------------------------------------------------------------

let pluginsTimer = 0;

function duration(value) {
  return value ? `${(parseFloat(value) * 1000).toFixed(1)} ms` : "-";
}

function pluginRow(plugin) {
  const stats = plugin.stats || {};
  const counters = [
    ["calls", stats.calls], ["errors", stats.errors], ["timeouts", stats.timeouts],
    ["fail-opens", stats.failOpens], ["dropped", stats.droppedNotifications],
    ["reconnects", stats.reconnects], ["oversized", stats.oversizedCalls],
    ["protocol errors", stats.protocolErrors], ["unexpected", stats.unexpectedResults],
  ];
  const subscriptions = (plugin.subscriptions || []).map((s) => {
    const seam = String(s.seam || "").replace("SEAM_", "").toLowerCase();
    return `${seam} (order ${s.order || 0}${s.failurePolicy ? `, ${String(s.failurePolicy).replace("FAILURE_POLICY_", "").toLowerCase()}` : ""})`;
  });
  const latencies = (plugin.latencies || []).map(
    (l) => `${String(l.seam || "").replace("SEAM_", "").toLowerCase()}: ${l.calls || 0} calls, p50 ${duration(l.p50)}, p99 ${duration(l.p99)}`,
  );
  return h(
    "section", { class: "plugin", "data-plugin": plugin.name },
    h("h3", {}, `${plugin.name}${plugin.version ? ` ${plugin.version}` : ""}`),
    h("dl", {},
      h("dt", {}, "State"), h("dd", { class: "plugin-state" }, String(plugin.state || "").replace("PLUGIN_STATE_", "").toLowerCase()),
      h("dt", {}, "Address"), h("dd", {}, plugin.address || ""),
      h("dt", {}, "Required"), h("dd", {}, plugin.required ? "yes" : "no"),
      h("dt", {}, "Subscriptions"), h("dd", {}, subscriptions.join("; ") || "none"),
      h("dt", {}, "Tools"), h("dd", {}, (plugin.tools || []).map((t) => t.name).join(", ") || "none"),
      h("dt", {}, "Counters"), h("dd", {}, counters.map(([k, v]) => `${k} ${v || 0}`).join(", ")),
      h("dt", {}, "Latencies"), h("dd", {}, latencies.join("; ") || "none yet"),
      h("dt", {}, "Last error"), h("dd", {}, plugin.lastError || "none"),
    ),
  );
}

let pluginsBusy = false;

async function refreshPlugins() {
  clearTimeout(pluginsTimer);
  if ($("#plugins-view").hidden || pluginsBusy) return;
  pluginsBusy = true;
  const scope = currentRoute;
  try {
    const answer = await registry("ListPlugins", {});
    const plugins = answer.plugins || [];
    $("#plugins").replaceChildren(...(plugins.length ? plugins.map(pluginRow) : [h("p", {}, "No plugins registered.")]));
  } catch (error) {
    fail(error, "Listing the plugins", scope);
  } finally {
    pluginsBusy = false;
  }
  pluginsTimer = setTimeout(refreshPlugins, PLUGINS_EVERY);
}

// ---- routing -------------------------------------------------------------------------

/** A route's parts decoded; null when one is not valid %-encoding (`%E0%A4%A`). */
function decodeParts(path) {
  try {
    return path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return null;
  }
}

function route() {
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const decoded = decodeParts(path);
  const parts = decoded || [];
  currentRoute = hash;
  const box = $("#notice");
  if (box.dataset.route !== "") box.hidden = true; // the previous route's notice
  if (session) session.close();
  session = null;
  $("#home-view").hidden = true;
  $("#session-view").hidden = true;
  $("#plugins-view").hidden = true;
  if (parts[0] === "agent" || parts[0] === "session") {
    $("#session-view").hidden = false;
    $("#turns").replaceChildren();
    $("#approvals").replaceChildren();
    $("#approvals").hidden = true;
    session = new Session({
      agentId: parts[0] === "agent" ? parts[1] : "",
      sessionId: parts[0] === "session" ? parts[1] : "",
      seq: Number(params.get("seq") || 0),
      page: Number(params.get("page") || 0), // events per page (default PAGE)
    });
    const opening = session;
    opening.open().catch((error) => {
      if (!opening.controller.signal.aborted) fail(error, "Opening the session", opening.scope);
    });
  } else if (parts[0] === "plugins") {
    $("#plugins-view").hidden = false;
    refreshPlugins();
  } else {
    $("#home-view").hidden = false;
    if (decoded === null) notify(`The address ${hash.slice(0, 200)} is not a page of the console; showing the agents.`);
  }
  document.querySelectorAll("#agents a[aria-current]").forEach((a) => a.removeAttribute("aria-current"));
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken($("#token").value);
  clearNotice();
  refreshAgents();
  route();
});

$("#token").value = getToken();
window.addEventListener("hashchange", route);
refreshAgents();
route();
