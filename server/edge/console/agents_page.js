// The agents list, as a tree of work (sub-agents under their parent), with each
// agent's context gauge, kept live by the server-wide agent events (StreamAgentEvents:
// a status, an approval or a context size changes the row at once; an agent created or
// disposed lists them again); polled only while that stream is down. And the form that
// creates an agent.
import { ApiError, agentFeed, factory } from "./api.js";
import { contextGauge } from "./context_gauge.js";
import { $, clearNotice, fail, notify } from "./notices.js";
import { h, millis } from "./session.js";

const POLL_EVERY = 2000; // only while the agent events stream is down
const FEED_RETRY = 2000;

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

let agentsTimer = 0;
export const known = new Map(); // agent id -> Agent JSON
let live = false; // whether the server-wide agent events stream is subscribed
let feed = null; // its AbortController

/** The page showing one agent, told of each change of the list: { agentId, listed(known) }, or null. */
let shown = null;

export function showing(page) {
  shown = page;
}

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

/**
 * The agents in tree order: each top-level agent (by id), then its sub-agents depth
 * first, as [agent, depth] pairs. A child whose parent is not listed is top-level here.
 */
export function treeOrder(list) {
  const ids = new Set(list.map((a) => a.agentId));
  const byParent = new Map();
  for (const agent of list) {
    const parent = (agent.lineage && agent.lineage.parentAgentId) || "";
    const key = ids.has(parent) ? parent : "";
    if (!byParent.has(key)) byParent.set(key, []);
    byParent.get(key).push(agent);
  }
  const ordered = [];
  const walk = (key, depth) => {
    for (const agent of byParent.get(key) || []) {
      ordered.push([agent, depth]);
      walk(agent.agentId, depth + 1);
    }
  };
  walk("", 0);
  return ordered;
}

/**
 * The provider and model an agent's requests use, as the server resolved them
 * (`Agent.resolved_provider`, `resolved_model`), saying which came from a default.
 */
function modelWords(agent) {
  const options = agent.options || {};
  const provider = options.provider || agent.resolvedProvider;
  const model = options.model || agent.resolvedModel;
  if (!provider) return "server default"; // a server too old to say what it resolved
  const defaulted = !options.provider ? " (server default)" : !options.model ? " (provider default)" : "";
  return `${provider} / ${model || "no model"}${defaulted}`;
}

function agentRow(agent, depth, current) {
  const options = agent.options || {};
  const created = agent.createTime ? new Date(millis(agent.createTime)).toLocaleString() : "";
  const link = h("a", { href: `#/agent/${encodeURIComponent(agent.agentId)}` }, agent.agentId);
  if (agent.agentId === current) link.setAttribute("aria-current", "page");
  const word = statusWord(agent.status, (agent.pendingApprovals || []).length);
  const parent = depth ? agent.lineage.parentAgentId : "";
  const name = h("th", { scope: "row", class: depth ? "child" : null, style: depth ? `padding-left: ${depth * 1.2 + 0.4}rem` : null },
    depth ? h("span", { "aria-hidden": "true" }, "↳ ") : null,
    link,
    depth ? h("span", { class: "sr-only" }, ` (sub-agent of ${parent})`) : null);
  return h(
    "tr", { "data-agent": agent.agentId, "data-parent": parent || null, "data-depth": depth },
    name,
    h("td", { class: `status ${word.replaceAll(" ", "-")}` }, word),
    h("td", { class: "context" }, contextGauge(agent.contextUsage)),
    h("td", { class: "model" }, modelWords(agent)),
    h("td", {}, h("time", { datetime: agent.createTime || "" }, created)),
  );
}

let agentsBusy = false; // one listing at a time: a call during one asks for another after
let agentsAgain = false;

export async function refreshAgents() {
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
    const current = shown && shown.agentId;
    for (const agent of list) known.set(agent.agentId, agent);
    body.replaceChildren(...treeOrder(list).map(([agent, depth]) => agentRow(agent, depth, current)));
    if (!list.length) body.append(h("tr", {}, h("td", { colspan: 5 }, "No agents yet.")));
    $("#agents-updated").textContent = `(${list.length}, ${live ? "live" : "polled"})`;
    if (shown) shown.listed(known);
  } catch (error) {
    fail(error, "Listing the agents");
  } finally {
    agentsBusy = false;
  }
  if (agentsAgain || !live) agentsTimer = setTimeout(refreshAgents, agentsAgain ? 0 : POLL_EVERY);
  agentsAgain = false;
}

/** Wire the create form, list the agents and follow them live. */
export function startAgents() {
  $("#create-form").addEventListener("submit", createAgent);
  refreshAgents();
  followAgents();
}

/** Follow the agent events again at once (a new token). */
export function followAgents() {
  if (feed) feed.abort();
  const mine = new AbortController();
  feed = mine;
  (async () => {
    while (!mine.signal.aborted) {
      try {
        await agentFeed(applyFeed, mine.signal);
      } catch (error) {
        if (mine.signal.aborted) return;
        if (error instanceof ApiError && error.status === "UNIMPLEMENTED") {
          live = false; // a server without the stream: the list is polled
          refreshAgents();
          return;
        }
      }
      live = false; // down: polled until it is back (the list says so)
      refreshAgents();
      await new Promise((resolve) => setTimeout(resolve, FEED_RETRY));
    }
  })();
}

/** One response of the agent events stream, applied to the list. */
function applyFeed(response) {
  if (response.subscribed) {
    live = true;
    refreshAgents(); // the state the events apply to, read after subscribing
    return;
  }
  let relist = Number(response.droppedEvents || 0) > 0;
  for (const event of response.events || []) {
    if (event.created || event.disposed) {
      relist = true; // membership and lineage: read the list again
      continue;
    }
    const agent = known.get(event.agentId);
    if (!agent) continue;
    if (event.status) agent.status = event.status.status;
    const pending = agent.pendingApprovals || [];
    if (event.approvalRequested && !pending.some((a) => a.approvalId === event.approvalRequested.approvalId)) {
      agent.pendingApprovals = [...pending, event.approvalRequested];
    }
    if (event.approvalResolved) {
      agent.pendingApprovals = pending.filter((a) => a.approvalId !== event.approvalResolved.approvalId);
    }
    if (event.contextUsage) showAgentContext(event.agentId, event.contextUsage);
    showAgentStatus(event.agentId, agent.status, (agent.pendingApprovals || []).length);
  }
  if (relist) refreshAgents();
  else if (shown) shown.listed(known);
}

async function createAgent(event) {
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
  const window = form.get("window").trim();
  if (window) options.contextWindowTokens = window; // uint64: a string in JSON
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
}

/** A live status change, shown in the agents table at once. */
export function showAgentStatus(agentId, status, pending = 0) {
  const cell = document.querySelector(`#agents tr[data-agent="${CSS.escape(agentId)}"] td.status`);
  if (!cell || !status) return;
  const word = statusWord(status, pending);
  cell.textContent = word;
  cell.className = `status ${word.replaceAll(" ", "-")}`;
}

/** A live context size, shown in the agents table at once. */
export function showAgentContext(agentId, usage) {
  const cell = document.querySelector(`#agents tr[data-agent="${CSS.escape(agentId)}"] td.context`);
  if (cell && usage) cell.replaceChildren(contextGauge(usage));
  const agent = known.get(agentId);
  if (agent && usage) agent.contextUsage = usage;
}
