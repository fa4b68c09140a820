// The agents list (polled) and the form that creates an agent.
import { factory } from "./api.js";
import { $, clearNotice, fail, notify } from "./notices.js";
import { h, millis } from "./session.js";

const AGENTS_EVERY = 2000;

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

/** The page showing one agent, told of each poll: { agentId, listed(known) }, or null. */
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

let agentsBusy = false; // one poll at a time: a call during one asks for another after
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
    if (shown) shown.listed(known);
  } catch (error) {
    fail(error, "Listing the agents");
  } finally {
    agentsBusy = false;
  }
  agentsTimer = setTimeout(refreshAgents, agentsAgain ? 0 : AGENTS_EVERY);
  agentsAgain = false;
}

/** Wire the create form and start polling the agents. */
export function startAgents() {
  $("#create-form").addEventListener("submit", createAgent);
  refreshAgents();
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

/** A live status change, shown in the agents table before the next poll. */
export function showAgentStatus(agentId, status, pending = 0) {
  const cell = document.querySelector(`#agents tr[data-agent="${CSS.escape(agentId)}"] td.status`);
  if (!cell || !status) return;
  const word = statusWord(status, pending);
  cell.textContent = word;
  cell.className = `status ${word.replaceAll(" ", "-")}`;
}
