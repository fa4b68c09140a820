// The session page (#/agent/<id>, #/session/<id>?seq=N): its events paged in and
// followed live, the pending approvals, and the form that talks to the agent.
import { ApiError, agents, factory, stream } from "./api.js";
import { known, refreshAgents, showAgentContext, showAgentStatus, showing, statusWord } from "./agents_page.js";
import { approvalEntry } from "./approvals.js";
import { confirmAction } from "./confirm.js";
import { contextGauge } from "./context_gauge.js";
import { $, clearNotice, fail, notify, routeNow } from "./notices.js";
import { SessionView, approvalOutcome, h } from "./session.js";
import { showChildren } from "./work_tree.js";

const PAGE = 500; // events loaded at once (the tail of a session, then older pages)
const RETRY_AFTER = 1000;

let session = null;

class Session {
  constructor({ agentId, sessionId, seq, page }) {
    this.scope = routeNow(); // the route its notices belong to
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
    this.eventCount = 0;
    this.progress = new Map(); // child agent id -> its latest ChildProgress
  }

  close() {
    this.controller.abort();
  }

  /** The agents list changed: the status from it, until this page's stream tells it. */
  listed(agentsById) {
    if (!this.agentId || !agentsById.has(this.agentId)) return;
    const agent = agentsById.get(this.agentId);
    if (!this.live) this.showStatus(agent.status);
    showAgentStatus(this.agentId, this.status, this.pending.size); // the live word
    this.showContext(agent.contextUsage);
    showChildren(this.agentId, agentsById, this.progress);
  }

  /** The context gauge of the agent (GetAgent's, then each live `context_usage`). */
  showContext(usage) {
    const box = $("#session-context");
    box.hidden = !this.agentId || !usage;
    if (usage) box.replaceChildren(h("span", { class: "label" }, "context"), contextGauge(usage));
  }

  /** A sub-agent's step or end: in the delegate call's box and the list of children. */
  childProgress(progress) {
    this.progress.set(progress.childAgentId, progress);
    this.view.childOf(progress.toolCallId, {
      agentId: progress.childAgentId, sessionId: progress.childSessionId,
      state: progress.state, step: progress.step, text: progress.text,
    });
    showChildren(this.agentId, known, this.progress);
  }

  get first() {
    return this.events.length ? Number(this.events[0].seq) : 0;
  }

  get last() {
    return this.events.length ? Number(this.events[this.events.length - 1].seq) : 0;
  }

  /** Dispose while an agent is live on the session; resume when none is. */
  showActions() {
    const live = Boolean(this.agentId) && this.status !== "AGENT_STATUS_DISPOSED";
    $("#dispose-agent").hidden = !live;
    $("#resume-session").hidden = live;
  }

  showStatus(status) {
    this.status = status || this.status;
    this.showActions();
    const word = statusWord(this.status, this.pending.size);
    $("#session-status").textContent = `Status: ${word}`;
    $("#session-status").dataset.status = word;
    if (this.agentId) showAgentStatus(this.agentId, this.status, this.pending.size);
  }

  async open() {
    const selector = this.agentId ? { agentId: this.agentId } : { sessionId: this.sessionId };
    const got = await agents("GetSession", selector);
    const found = got.session;
    this.sessionId = found.sessionId;
    this.agentId = this.agentId || found.agentId || "";
    this.eventCount = Number(found.eventCount || 0);
    $("#session-title").textContent = this.agentId ? `Agent ${this.agentId}` : `Session ${this.sessionId}`;
    $("#session-id").textContent = `session ${this.sessionId}`;
    $("#session-link").href = `#/session/${encodeURIComponent(this.sessionId)}`;
    $("#act-form").hidden = !this.agentId;
    if (this.agentId && known.has(this.agentId)) {
      this.showStatus(known.get(this.agentId).status);
      this.showContext(known.get(this.agentId).contextUsage);
      showChildren(this.agentId, known, this.progress);
    } else $("#session-status").textContent = this.agentId ? "" : "Status: no live agent";
    this.view = new SessionView($("#turns"), this.sessionId, {
      totals: $("#session-tokens"),
      fork: (seq) => forkSession(this, seq),
      prices: got.prices || [],
    });
    this.showActions();
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
    const body = { agentId: this.agentId, approvalId, decision, via: "console" }; // resolved by api:console
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
      this.eventCount = Math.max(this.eventCount, Number(event.seq));
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
      if (event.contextUsage) {
        this.showContext(event.contextUsage);
        showAgentContext(this.agentId, event.contextUsage);
      }
      if (event.childProgress) this.childProgress(event.childProgress);
      if (event.disposed) {
        this.pending.clear();
        this.showApprovals();
        this.showStatus("AGENT_STATUS_DISPOSED");
      }
      if (event.error) notify(`Agent ${this.agentId}: ${event.error.message}`, "agent", this.scope);
    }
  }
}

/** Show the session page for `parts` (["agent", id] or ["session", id]) and `params`. */
export function openSession(parts, params) {
  $("#session-view").hidden = false;
  $("#session-context").hidden = true;
  $("#children").hidden = true;
  $("#turns").replaceChildren();
  $("#approvals").replaceChildren();
  $("#approvals").hidden = true;
  session = new Session({
    agentId: parts[0] === "agent" ? parts[1] : "",
    sessionId: parts[0] === "session" ? parts[1] : "",
    seq: Number(params.get("seq") || 0),
    page: Number(params.get("page") || 0), // events per page (default PAGE)
  });
  showing(session);
  const opening = session;
  opening.open().catch((error) => {
    if (!opening.controller.signal.aborted) fail(error, "Opening the session", opening.scope);
  });
}

/** Leave the session page: its stream and calls stop. */
export function closeSession() {
  if (session) session.close();
  session = null;
  showing(null);
}

/** Wire the page's buttons and forms (once). */
export function startSessionPage() {
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

  $("#delete-session").addEventListener("click", () => session && deleteSession(session));
  $("#dispose-agent").addEventListener("click", () => session && disposeAgent(session));
  $("#resume-session").addEventListener("click", () => session && resumeSession(session));

  $("#compact-agent").addEventListener("click", () => session && session.agentId && compactAgent(session));

  $("#cancel-turn").addEventListener("click", async () => {
    if (!session || !session.agentId) return;
    try {
      const answer = await agents("CancelTurn", { agentId: session.agentId, reason: "cancelled from the console" });
      notify(answer.cancelled ? "Turn cancelled." : "No turn was running.", "info");
    } catch (error) {
      fail(error, "Cancel");
    }
  });
}

/** A fresh request id: a retried delete is answered once. */
function requestId() {
  if (globalThis.crypto && crypto.randomUUID) return crypto.randomUUID();
  return `console-${Date.now()}-${Math.random().toString(36).slice(2)}`;
}

/**
 * Delete the page's session, once confirmed. While an agent is live on it the server
 * refuses (SESSION_IN_USE) unless the person asked to dispose the agent first.
 */
async function deleteSession(shown) {
  const live = Boolean(shown.agentId) && shown.status !== "AGENT_STATUS_DISPOSED" && known.has(shown.agentId);
  const answer = await confirmAction({
    title: `Delete session ${shown.sessionId}?`,
    message: `Its ${shown.eventCount} events, its pending messages and its request records are removed for good; ` +
      "forks of it stay whole." +
      (live ? ` Agent ${shown.agentId} is live on it: the server refuses while it is, unless it is disposed first.` : ""),
    confirmLabel: "Delete for good",
    option: live ? `Dispose agent ${shown.agentId} first (a running turn ends "disposed"; its sub-agents are disposed too)` : "",
  });
  if (!answer || session !== shown) return;
  try {
    const done = await agents("DeleteSession", { sessionId: shown.sessionId, disposeAgent: answer.option, requestId: requestId() });
    const disposed = done.disposedAgentId ? ` (agent ${done.disposedAgentId} disposed first)` : "";
    const words = `Session ${done.sessionId} deleted: ${done.deletedEvents || 0} events removed${disposed}.`;
    window.addEventListener("hashchange", () => notify(words, "info"), { once: true });
    location.hash = "#/";
    refreshAgents();
  } catch (error) {
    if (error instanceof ApiError && error.reason === "SESSION_IN_USE") {
      notify(`Not deleted (${error.status}, ${error.reason}): ${error.message}. To dispose the agent and delete, choose Delete again and tick "Dispose agent … first".`, "error", shown.scope);
    } else {
      fail(error, "Deleting the session", shown.scope);
    }
  }
}

const ID_PATTERN = "[A-Za-z0-9._:\\-]{1,128}";

/** Dispose the page's agent, once confirmed: its session stays readable. */
async function disposeAgent(shown) {
  const answer = await confirmAction({
    title: `Dispose agent ${shown.agentId}?`,
    message: `A running turn ends "disposed", its sub-agents are disposed first, and the agent leaves the server. ` +
      `Its session ${shown.sessionId} stays stored: it can be read, forked or resumed.`,
    confirmLabel: "Dispose",
  });
  if (!answer || session !== shown) return;
  try {
    await factory("DisposeAgent", { agentId: shown.agentId });
    notify(`Agent ${shown.agentId} disposed; its session stays stored.`, "info", shown.scope);
    shown.showStatus("AGENT_STATUS_DISPOSED");
    refreshAgents();
  } catch (error) {
    fail(error, "Disposing the agent", shown.scope);
  }
}

/**
 * Compact the page's agent now (`CompactAgent`), once confirmed, with optional
 * instructions for the summary. The older history is replaced by a summary in what
 * the model receives; the full log stays stored.
 */
async function compactAgent(shown) {
  const answer = await confirmAction({
    title: `Compact agent ${shown.agentId}?`,
    message: "Its older turns are summarised and the summary replaces them in what the model " +
      "receives from now on; the most recent turns stay verbatim and the full log stays stored.",
    confirmLabel: "Compact",
    input: { label: "Instructions for the summary (optional)", value: "", placeholder: "e.g. focus on the open bugs" },
  });
  if (!answer || session !== shown) return;
  try {
    const body = { agentId: shown.agentId, requestId: requestId() };
    if (answer.value) body.instructions = answer.value;
    const done = await agents("CompactAgent", body);
    if (done.compacted) {
      const usage = done.contextUsage || {};
      notify(`Compacted at seq ${done.eventSeq}: context now ${usage.usedTokens || 0} tokens.`, "info", shown.scope);
    } else {
      notify(`Not compacted: ${done.reason || "nothing to compact"}.`, "info", shown.scope);
    }
  } catch (error) {
    fail(error, "Compacting the agent", shown.scope);
  }
}

/** Resume the page's stored session as a new agent, once confirmed (and named). */
async function resumeSession(shown) {
  const answer = await confirmAction({
    title: `Resume session ${shown.sessionId}?`,
    message: "A new agent drives the session on: its history, turn and sequence numbers go on, " +
      "with the options stored with the session.",
    confirmLabel: "Resume",
    input: { label: "New agent id", value: "", placeholder: "letters, digits, . _ : -", pattern: ID_PATTERN, required: true },
  });
  if (!answer || session !== shown) return;
  try {
    const done = await factory("ResumeAgent", { agentId: answer.value, sessionId: shown.sessionId });
    location.hash = `#/agent/${encodeURIComponent(done.agent.agentId)}`;
    refreshAgents();
  } catch (error) {
    fail(error, "Resuming the session", shown.scope);
  }
}

/** Fork the page's session after the turn end `seq`, once confirmed; open the fork. */
async function forkSession(shown, seq) {
  const answer = await confirmAction({
    title: `Fork session ${shown.sessionId} after seq ${seq}?`,
    message: `A new stored session starts with a copy of events 1 to ${seq}; this one is unchanged. ` +
      "Resume an agent on the fork to go on from there.",
    confirmLabel: "Fork",
    input: { label: "Id of the fork (optional)", value: "", placeholder: "generated", pattern: ID_PATTERN },
  });
  if (!answer || session !== shown) return;
  try {
    const body = { sessionId: shown.sessionId, boundarySeq: String(seq) };
    if (answer.value) body.newSessionId = answer.value;
    const done = await agents("ForkSession", body);
    const id = done.session.sessionId;
    window.addEventListener("hashchange", () => notify(`Forked after seq ${seq}: session ${id}.`, "info"), { once: true });
    location.hash = `#/session/${encodeURIComponent(id)}`;
  } catch (error) {
    fail(error, "Forking the session", shown.scope);
  }
}
