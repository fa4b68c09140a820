// The plugins page (#/plugins): each plugin's state, subscriptions, counters and
// latencies, and each MCP server's state and tools (ListToolSources), polled while the
// page shows.
import { registry } from "./api.js";
import { $, fail, routeNow } from "./notices.js";
import { h } from "./session.js";

const PLUGINS_EVERY = 3000;

let pluginsTimer = 0;

function duration(value) {
  return value ? `${(parseFloat(value) * 1000).toFixed(1)} ms` : "-";
}

// A subscription's match conditions, in a few words ("" when it has none).
function conditionsOf(subscription) {
  const c = subscription.conditions || {};
  const parts = [];
  if ((subscription.agentIds || []).length) parts.push(`agents ${subscription.agentIds.join(", ")}`);
  const labels = Object.entries(c.agentLabels || {}).map(([k, v]) => `${k}=${v}`);
  if (labels.length) parts.push(`labels ${labels.join(", ")}`);
  if ((c.tools || []).length) parts.push(`tools ${c.tools.join(", ")}`);
  const kinds = [...(subscription.eventKinds || []), ...(c.eventKinds || [])];
  if (kinds.length) parts.push(`events ${kinds.join(", ")}`);
  if (c.promptPrefix) parts.push(`prompt starts "${c.promptPrefix}"`);
  if (c.promptRegex) parts.push(`prompt matches /${c.promptRegex}/`);
  return parts.length ? `, only ${parts.join("; ")}` : "";
}

function pluginRow(plugin) {
  const stats = plugin.stats || {};
  const counters = [
    ["calls", stats.calls], ["errors", stats.errors], ["timeouts", stats.timeouts],
    ["fail-opens", stats.failOpens], ["dropped", stats.droppedNotifications],
    ["reconnects", stats.reconnects], ["oversized", stats.oversizedCalls],
    ["protocol errors", stats.protocolErrors], ["unexpected", stats.unexpectedResults],
    ["skipped", stats.skippedCalls],
  ];
  const subscriptions = (plugin.subscriptions || []).map((s) => {
    const seam = String(s.seam || "").replace("SEAM_", "").toLowerCase();
    return `${seam} (order ${s.order || 0}${s.failurePolicy ? `, ${String(s.failurePolicy).replace("FAILURE_POLICY_", "").toLowerCase()}` : ""}${conditionsOf(s)})`;
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

function stateWord(state) {
  return String(state || "unspecified").replace("PLUGIN_STATE_", "").toLowerCase();
}

/** One MCP server of the config: how it is reached, its state, its tools. */
function sourceRow(source) {
  const tools = source.tools || [];
  return h(
    "section", { class: "plugin tool-source", "data-source": source.name },
    h("h3", {}, source.name),
    h("dl", {},
      h("dt", {}, "State"), h("dd", { class: "source-state" }, stateWord(source.state)),
      h("dt", {}, "Transport"), h("dd", {}, source.transport || "?"),
      h("dt", {}, "Endpoint"), h("dd", {}, h("code", {}, source.endpoint || "")),
      h("dt", {}, `Tools (${tools.length})`),
      h("dd", { class: "source-tools" }, tools.length ? h("ul", {}, ...tools.map((t) => h("li", {}, h("code", {}, t)))) : "none"),
      h("dt", {}, "Last error"), h("dd", { class: "source-error" }, source.lastError || "none"),
    ),
  );
}

let pluginsBusy = false;

export async function refreshPlugins() {
  clearTimeout(pluginsTimer);
  if ($("#plugins-view").hidden || pluginsBusy) return;
  pluginsBusy = true;
  const scope = routeNow();
  try {
    const [answer, listed] = await Promise.all([registry("ListPlugins", {}), registry("ListToolSources", {})]);
    const plugins = answer.plugins || [];
    $("#plugins").replaceChildren(...(plugins.length ? plugins.map(pluginRow) : [h("p", {}, "No plugins registered.")]));
    const sources = listed.sources || [];
    $("#tool-sources").replaceChildren(
      ...(sources.length ? sources.map(sourceRow) : [h("p", {}, "No MCP servers configured (mcpServers in the config).")]),
    );
  } catch (error) {
    fail(error, "Listing the plugins", scope);
  } finally {
    pluginsBusy = false;
  }
  pluginsTimer = setTimeout(refreshPlugins, PLUGINS_EVERY);
}
