// The context gauge of an agent: context used / window (Agent.context_usage, then the
// live `context_usage` agent events). A <meter> for the eye, words for everyone.
import { h } from "./session.js";

/** Tokens as short words: 950, 12.3k, 1.05M. */
export function tokens(count) {
  const n = Number(count || 0);
  if (n < 1000) return String(n);
  if (n < 1_000_000) return `${(n / 1000).toFixed(n < 10_000 ? 2 : 1).replace(/\.?0+$/, "")}k`;
  return `${(n / 1_000_000).toFixed(2).replace(/\.?0+$/, "")}M`;
}

/** What the gauge says, e.g. "12.3k / 128k tokens (10%)". */
export function usageWords(usage) {
  if (!usage) return "no context yet";
  const used = Number(usage.usedTokens || 0);
  const window = Number(usage.windowTokens || 0);
  const estimate = usage.estimated ? "~" : "";
  if (!window) return `${estimate}${tokens(used)} tokens (no window known)`;
  const share = Math.round((used / window) * 100);
  return `${estimate}${tokens(used)} / ${tokens(window)} tokens (${share}%)`;
}

/** A gauge element for `usage` (ContextUsage JSON, or undefined). */
export function contextGauge(usage) {
  const window = Number((usage && usage.windowTokens) || 0);
  const used = Number((usage && usage.usedTokens) || 0);
  const words = usageWords(usage);
  const compactAt = Number((usage && usage.compactAtTokens) || 0);
  const meter = window
    ? h("meter", {
      min: 0, max: window, value: Math.min(used, window),
      high: compactAt || Math.round(window * 0.9), optimum: 0, "aria-hidden": "true",
    })
    : null;
  const title = compactAt ? `${words}; compacts at ${tokens(compactAt)}` : words;
  return h("span", { class: "context-gauge", title, "data-used": used, "data-window": window },
    meter, " ", h("span", { class: "context-words" }, words));
}
