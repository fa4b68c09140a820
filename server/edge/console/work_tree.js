// The tree of work on an agent's page: its live sub-agents (Agent.lineage), each with
// its status, context and latest progress (the parent's `child_progress` events).
import { statusWord } from "./agents_page.js";
import { contextGauge } from "./context_gauge.js";
import { $ } from "./notices.js";
import { h } from "./session.js";

/**
 * Render #children for the agent `agentId`: its live children from `known` (agent id ->
 * Agent JSON), with `progress` (child id -> the latest ChildProgress JSON).
 */
export function showChildren(agentId, known, progress) {
  const parent = known.get(agentId);
  const ids = (parent && parent.lineage && parent.lineage.childAgentIds) || [];
  const box = $("#children");
  box.hidden = ids.length === 0;
  $("#children-list").replaceChildren(...ids.map((id) => childItem(id, known.get(id), progress.get(id))));
}

function childItem(id, agent, latest) {
  const status = agent ? statusWord(agent.status, (agent.pendingApprovals || []).length) : "not listed yet";
  const via = agent && agent.lineage && agent.lineage.parentToolCallId ? ` · call ${agent.lineage.parentToolCallId}` : "";
  const said = latest
    ? h("span", { class: "child-progress" },
      ` · ${latest.state === "running" ? `step ${latest.step || "?"} done` : latest.state}`,
      latest.text ? `: “${latest.text}”` : "")
    : null;
  return h("li", { "data-child": id },
    h("a", { href: `#/agent/${encodeURIComponent(id)}` }, id), " · ",
    h("span", { class: "status" }, status), " · ",
    agent ? contextGauge(agent.contextUsage) : "", via, said);
}
