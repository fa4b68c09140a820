// The session page (#/agent/<id>, #/session/<id>?seq=N): its events paged in and
// followed live, the pending approvals, and the form that talks to the agent.
import { ApiError, agents, stream } from "./api.js";
import { known, showAgentStatus, showing, statusWord } from "./agents_page.js";
import { approvalEntry } from "./approvals.js";
import { $, clearNotice, fail, notify, routeNow } from "./notices.js";
import { SessionView, approvalOutcome, h } from "./session.js";

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
  }

  close() {
    this.controller.abort();
  }

  /** The agents were polled: the status from the list, until the stream tells it. */
  listed(agentsById) {
    if (!this.agentId || !agentsById.has(this.agentId)) return;
    if (!this.live) this.showStatus(agentsById.get(this.agentId).status);
    showAgentStatus(this.agentId, this.status, this.pending.size); // the live word
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

/** Show the session page for `parts` (["agent", id] or ["session", id]) and `params`. */
export function openSession(parts, params) {
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
