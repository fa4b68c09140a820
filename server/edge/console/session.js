// The session view: session events (the protobuf JSON mapping) applied one at a time to
// the DOM, in seq order. Turns are <details> blocks, steps sections inside them; every
// event's element carries its seq (title, data-seq) and a link to it.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

/** Milliseconds since the epoch of a protobuf JSON timestamp (nanoseconds trimmed). */
export function millis(timestamp) {
  if (!timestamp) return NaN;
  return Date.parse(timestamp.replace(/(\.\d{3})\d+/, "$1"));
}

export function textOf(blocks = []) {
  return blocks
    .map((b) => {
      if (b.text) return b.text.text || "";
      if (b.reasoning) return `[reasoning] ${b.reasoning.text || ""}`;
      if (b.toolCall) return `[tool call ${b.toolCall.name}] ${b.toolCall.arguments || ""}`;
      if (b.toolResult) return textOf(b.toolResult.content);
      return "";
    })
    .join("");
}

function pretty(json) {
  if (!json) return "";
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}

function seconds(ms) {
  return `${(ms / 1000).toFixed(3)} s`;
}

const ENUM_PREFIXES = ["TRIGGER_KIND_", "HEADER_REASON_", "BLOCK_KIND_", "FINISH_KIND_"];

function enumName(value) {
  let name = String(value || "unspecified");
  for (const prefix of ENUM_PREFIXES) name = name.replace(prefix, "");
  return name.toLowerCase().replaceAll("_", " ");
}

/** An ApprovalOutcome as words: "allowed once", "rejected", "cancelled", "timed out". */
export function approvalOutcome(value) {
  return String(value || "APPROVAL_OUTCOME_UNSPECIFIED").replace("APPROVAL_OUTCOME_", "").toLowerCase().replaceAll("_", " ");
}

/** The end reason of a turn as words: "completed", "aborted: why", "error: ...". */
export function endReason(reason = {}) {
  const [kind, detail] = Object.entries(reason)[0] || ["unknown", {}];
  const words = kind.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
  const extra = [];
  if (detail && detail.reason) extra.push(detail.reason);
  if (detail && detail.message) extra.push(detail.message);
  if (detail && detail.code) extra.push(`code ${detail.code}`);
  if (detail && detail.step) extra.push(`in step ${detail.step}`);
  return extra.length ? `${words}: ${extra.join(", ")}` : words;
}

function headerSummary(header = {}) {
  const config = header.config || {};
  return {
    provider: config.provider || "",
    model: config.model || "",
    temperature: config.temperature ?? "",
    maxTokens: config.maxTokens ?? "",
    stop: (config.stop || []).join(", "),
    system: header.system || "",
    tools: (header.tools || []).map((t) => t.name),
    prefix: (header.messagePrefix || []).length,
  };
}

/** What changed between two request headers, as lines of text. */
function headerChanges(before, after) {
  if (!before) {
    return [
      `provider/model: ${after.provider}/${after.model}`,
      `tools: ${after.tools.join(", ") || "none"}`,
      `system prompt: ${after.system.length} characters`,
      ...(after.prefix ? [`message prefix: ${after.prefix} messages`] : []),
    ];
  }
  const lines = [];
  for (const key of ["provider", "model", "temperature", "maxTokens", "stop", "prefix"]) {
    if (before[key] !== after[key]) lines.push(`${key}: ${before[key] || "-"} → ${after[key] || "-"}`);
  }
  if (before.system !== after.system) lines.push(`system prompt changed (${after.system.length} characters)`);
  const added = after.tools.filter((t) => !before.tools.includes(t));
  const removed = before.tools.filter((t) => !after.tools.includes(t));
  if (added.length) lines.push(`tools added: ${added.join(", ")}`);
  if (removed.length) lines.push(`tools removed: ${removed.join(", ")}`);
  return lines.length ? lines : ["no change"];
}

/** Token counts as words: "1234 in, 56 out" (and cached input when any). */
function tokenWords(t) {
  return `${t.input} in${t.cached ? ` (${t.cached} cached)` : ""}, ${t.output} out`;
}

export function noTokens() {
  return { input: 0, output: 0, cached: 0, costs: new Map(), unpriced: false };
}

/** Adds a message's usage, and its cost when `price` (a `Price` of GetSession) is given. */
export function addUsage(total, usage, price) {
  const input = Number(usage.inputTokens || 0);
  const output = Number(usage.outputTokens || 0);
  total.input += input;
  total.output += output;
  total.cached += Number(usage.cachedInputTokens || 0);
  if (!price) {
    total.unpriced ||= input + output > 0;
    return;
  }
  const cost = (input * Number(price.inputPerMillion || 0) + output * Number(price.outputPerMillion || 0)) / 1e6;
  total.costs.set(price.currency, (total.costs.get(price.currency) || 0) + cost);
}

/** The cost of some tokens, per currency: "0.000225 USD" ("" when nothing is priced). */
export function costAmounts(t) {
  if (!t.costs.size) return "";
  const amounts = [...t.costs].map(([currency, amount]) => `${amount.toFixed(6)} ${currency}`);
  return `${amounts.join(" + ")}${t.unpriced ? " (some tokens unpriced)" : ""}`;
}

/** The cost of some tokens as a figure: " · cost 0.000225 USD" ("" when nothing is priced). */
function costWords(t) {
  const amounts = costAmounts(t);
  return amounts ? ` · cost ${amounts}` : "";
}

/** The price of an assistant message's answer: the table's row for its provider and model. */
export function priceFor(prices, message) {
  const by = message.provenance || {};
  return prices.find((q) => q.provider === by.provider && q.model === by.model);
}

/** A turn's or step's figures: how long it took (when its start is loaded), its tokens and cost. */
function figures(part, endTime) {
  const took = Number.isNaN(part.start) || Number.isNaN(endTime) ? "" : `${seconds(endTime - part.start)} · `;
  return `${took}${tokenWords(part.tokens)} tokens${costWords(part.tokens)}`;
}

export class SessionView {
  /**
   * `totals`: an element for the session's token totals; `fork(seq)`: called by a
   * turn end's "Fork" button; `prices`: GetSession's price table (all optional).
   */
  constructor(root, sessionId, { totals = null, fork = null, prices = [] } = {}) {
    this.root = root;
    this.sessionId = sessionId;
    this.totals = totals;
    this.fork = fork;
    this.prices = prices;
    this.reset();
  }

  reset() {
    this.root.replaceChildren();
    this.tokens = noTokens(); // of the loaded events
    this.turnsEnded = 0;
    this.firstSeq = 0; // the first loaded event: above 1, the totals are partial
    this.showTotals();
    this.turn = null; // {element, body, number, ended}
    this.step = null; // {element, body, blocks: Map(index -> block), tools: []}
    this.tools = new Map(); // call id -> tool record
    this.lastHeader = null;
    this.latest = 0; // ms of the latest event seen: the "now" of running tools
  }

  link(seq) {
    return `#/session/${encodeURIComponent(this.sessionId)}?seq=${seq}`;
  }

  row(event, kind, label, ...content) {
    const seq = Number(event.seq);
    const when = event.createTime ? new Date(millis(event.createTime)).toLocaleTimeString() : "";
    return h(
      "div",
      { class: `ev ${kind}`, "data-seq": seq, title: `seq ${seq}${when ? ` · ${when}` : ""}` },
      h("a", { class: "seq", href: this.link(seq), tabindex: "-1", "aria-label": `link to seq ${seq}` }, `#${seq}`),
      label ? h("span", { class: "label" }, label) : null,
      ...content,
    );
  }

  /** The element events outside any open turn go to (a "between turns" block). */
  container() {
    if (this.step) return this.step.body;
    if (this.turn && !this.turn.ended) return this.turn.body;
    let last = this.root.lastElementChild;
    if (!last || !last.classList.contains("between")) {
      last = h("div", { class: "between", role: "group", "aria-label": "between turns" });
      this.root.append(last);
    }
    return last;
  }

  /** The session's token totals, over the loaded events. */
  showTotals() {
    if (!this.totals) return;
    const partial = this.firstSeq > 1 ? " (of the loaded events)" : "";
    this.totals.textContent = `Tokens: ${tokenWords(this.tokens)} in ${this.turnsEnded} ended turns${partial}${costWords(this.tokens)}`;
  }

  openTurn(number, event, time = NaN) {
    const title = h("span", { class: "turn-title" }, `Turn ${number}`);
    const end = h("span", { class: "turn-end" }, "running");
    const stats = h("span", { class: "turn-figures" });
    const summary = h("summary", {}, title, " · ", end, " · ", stats);
    const body = h("div", { class: "turn-body" });
    const element = h("details", { class: "turn", open: true, "data-turn": number }, summary, body);
    if (event) summary.append(" ", h("a", { class: "seq", href: this.link(Number(event.seq)), tabindex: "-1" }, `#${event.seq}`));
    this.root.append(element);
    this.turn = { element, body, number, end, stats, ended: false, start: time, tokens: noTokens() };
    stats.textContent = figures(this.turn, NaN);
    this.step = null;
  }

  /** A turn or step seen mid-way (its start is in older, unloaded events). */
  ensure(turnNumber, stepNumber) {
    if (turnNumber && (!this.turn || this.turn.number !== turnNumber || this.turn.ended)) {
      this.openTurn(turnNumber, null);
      this.turn.body.append(h("p", { class: "partial" }, "Earlier events of this turn are not loaded."));
    }
    if (stepNumber && (!this.step || this.step.number !== stepNumber)) this.openStep(stepNumber, null);
  }

  openStep(number, event, time = NaN) {
    const stats = h("span", { class: "step-figures" });
    const heading = h("h3", { class: "step-title" }, `Step ${number} `, stats);
    const body = h("div", { class: "step-body" });
    const element = h("section", { class: "step", "data-step": number }, heading, body);
    if (event) {
      element.title = `seq ${event.seq}`;
      element.dataset.seq = event.seq;
      heading.append(" ", h("a", { class: "seq", href: this.link(Number(event.seq)), tabindex: "-1" }, `#${event.seq}`));
    }
    (this.turn ? this.turn.body : this.root).append(element);
    this.step = { element, body, number, stats, blocks: new Map(), tools: [], text: false, start: time, tokens: noTokens() };
    stats.textContent = `· ${figures(this.step, NaN)}`;
  }

  apply(event) {
    const time = millis(event.createTime);
    if (!Number.isNaN(time)) this.latest = Math.max(this.latest, time);
    if (!this.firstSeq) {
      this.firstSeq = Number(event.seq);
      this.showTotals();
    }
    const [kind] = Object.keys(event).filter((k) => !["seq", "createTime", "surfaceOp", "sourceEventSeqs"].includes(k));
    const payload = event[kind] || {};
    const handler = this[`on_${kind}`];
    if (handler) handler.call(this, event, payload, time);
    else this.container().append(this.row(event, "other", kind));
  }

  on_turnStart(event, p, time) {
    this.openTurn(p.turn, event, time);
    const source = p.source && p.source.kind ? ` from ${p.source.kind}` : "";
    this.turn.body.append(this.row(event, "turn-start", "turn start", `${enumName(p.trigger)}${source}`));
  }

  on_userMessage(event, p) {
    this.container().append(this.row(event, "user", "user", h("span", { class: "content" }, textOf(p.content))));
  }

  on_promptBlocked(event, p) {
    this.container().append(this.row(event, "blocked", "prompt blocked", `${p.reason || ""}: ${textOf(p.content)}`));
  }

  on_contextMessage(event, p) {
    const from = p.source && p.source.kind && p.source.kind !== "user" ? ` from ${[p.source.kind, p.source.name].filter(Boolean).join(" ")}` : "";
    this.container().append(this.row(event, "context", `context${from}`, h("span", { class: "content" }, textOf(p.content))));
  }

  on_steeringMessage(event, p) {
    this.ensure(p.turn, 0);
    // Shown where it landed: its seq's place in the open step, or between steps.
    this.container().append(this.row(event, "steering", "steering", h("span", { class: "content" }, textOf(p.content))));
  }

  on_messageDropped(event, p) {
    const what = p.steering ? "steering dropped" : "message dropped";
    this.container().append(this.row(event, "dropped", what, `${textOf(p.content)} (${p.reason || "no reason"})`));
  }

  on_stepStart(event, p, time) {
    this.ensure(p.turn, 0);
    this.openStep(p.step, event, time);
  }

  on_requestHeader(event, p) {
    const after = headerSummary(p.header);
    const lines = headerChanges(this.lastHeader, after);
    this.lastHeader = after;
    const list = h("ul", {}, ...lines.map((line) => h("li", {}, line)));
    this.container().append(
      this.row(event, "header", `request header (${enumName(p.reason)})`, h("details", {}, h("summary", {}, lines[0]), list)),
    );
  }

  on_assistantChunk(event, p) {
    this.ensure(p.turn, p.step);
    const chunk = p.chunk || {};
    const step = this.step;
    if (chunk.blockStart) {
      const start = chunk.blockStart;
      const index = start.index || 0;
      if (start.kind === "BLOCK_KIND_TOOL_CALL") {
        const tool = this.tool(event, start.toolCallId, start.toolName);
        step.blocks.set(index, { tool });
      } else {
        const reasoning = start.kind === "BLOCK_KIND_REASONING";
        const text = h("span", { class: "text" });
        const element = this.row(event, reasoning ? "reasoning" : "assistant", reasoning ? "reasoning" : "assistant", text);
        step.body.append(element);
        step.blocks.set(index, { text, element });
        if (!reasoning) step.text = true;
      }
    } else if (chunk.blockDelta) {
      const block = step.blocks.get(chunk.blockDelta.index || 0);
      const piece = h("span", { "data-seq": event.seq, title: `seq ${event.seq}` }, chunk.blockDelta.text || "");
      if (block && block.tool) block.tool.forming.append(piece);
      else if (block) block.text.append(piece);
    } else if (chunk.blockEnd) {
      const block = step.blocks.get(chunk.blockEnd.index || 0);
      if (block && block.element) block.element.classList.add("done");
    } else if (chunk.finish) {
      const f = chunk.finish;
      const detail = [f.message, f.code].filter(Boolean).join(", ");
      step.body.append(this.row(event, "finish", "finish", `${enumName(f.kind)}${detail ? `: ${detail}` : ""}`));
    } else if (chunk.usage) {
      const u = chunk.usage;
      step.body.append(this.row(event, "usage", "usage", `${u.inputTokens || 0} in, ${u.outputTokens || 0} out`));
    }
  }

  on_assistantMessage(event, p) {
    this.ensure(p.turn, p.step);
    const usage = p.usage ? ` · ${p.usage.inputTokens || 0} in, ${p.usage.outputTokens || 0} out` : "";
    const model = p.provenance ? ` · ${p.provenance.provider}/${p.provenance.model}` : "";
    // The text streamed already; a message whose chunks are not loaded shows it here.
    const text = this.step.text ? null : h("span", { class: "text" }, textOf((p.content || []).filter((b) => b.text)));
    if (p.usage) {
      // Priced by the provider and model that answered (a session may change model).
      const price = priceFor(this.prices, p);
      addUsage(this.tokens, p.usage, price);
      if (this.step) {
        addUsage(this.step.tokens, p.usage, price);
        this.step.stats.textContent = `· ${figures(this.step, NaN)}`;
      }
      if (this.turn) {
        addUsage(this.turn.tokens, p.usage, price);
        this.turn.stats.textContent = figures(this.turn, NaN);
      }
      this.showTotals();
    }
    this.step.body.append(this.row(event, "message", "assistant message", text, h("small", {}, `stored${model}${usage}`)));
  }

  tool(event, callId, name) {
    let tool = this.tools.get(callId);
    if (tool) return tool;
    const state = h("span", { class: "tool-state" }, "forming");
    const timing = h("span", { class: "timing" });
    const bar = h("span", { class: "bar" });
    const forming = h("pre", { class: "args" });
    const result = h("div", { class: "result" });
    const child = h("div", { class: "child", hidden: true });
    const element = this.row(
      event, "tool", "tool call",
      h("strong", { class: "tool-name" }, name || "?"), " ", state, " ", timing,
      h("span", { class: "track", "aria-hidden": "true" }, bar),
      h("div", { class: "args-box" }, h("span", { class: "label" }, "arguments"), forming),
      child,
      result,
    );
    element.dataset.call = callId;
    if (!this.step) this.ensure(this.turn ? this.turn.number : 0, 1);
    this.step.body.append(element);
    tool = { element, state, timing, bar, forming, child, result, start: NaN, end: NaN, ranStart: NaN, ranEnd: NaN, step: this.step };
    this.step.tools.push(tool);
    this.tools.set(callId, tool);
    return tool;
  }

  on_toolCall(event, p, time) {
    this.ensure(p.turn, p.step);
    const tool = this.tool(event, p.callId, p.name);
    tool.element.querySelector(".tool-name").textContent = p.name;
    tool.forming.textContent = pretty(p.arguments);
    tool.element.dataset.seq = event.seq;
    tool.element.title = `seq ${event.seq} (call ${p.callId})`;
    tool.start = time;
    tool.state.textContent = "running";
    tool.element.classList.add("running");
    this.timeline(tool.step);
  }

  on_toolResult(event, p, time) {
    this.ensure(p.turn, p.step);
    const tool = this.tools.get(p.callId) || this.tool(event, p.callId, p.error ? p.error.name : "");
    tool.end = time;
    tool.ranStart = millis(p.startTime); // NaN when it never ran, or in an older log
    tool.ranEnd = millis(p.endTime);
    const failed = Boolean(p.isError);
    tool.state.textContent = failed ? "failed" : "done";
    tool.element.classList.remove("running");
    tool.element.classList.add(failed ? "failed" : "ok");
    const error = p.error && (p.error.name || p.error.code) ? ` (${[p.error.name, p.error.code].filter(Boolean).join(", ")})` : "";
    tool.result.replaceChildren(
      this.row(event, failed ? "tool-error" : "tool-result", failed ? `error${error}` : "result", h("pre", {}, textOf(p.content))),
    );
    const meta = p.meta || {};
    if (meta.session_id) {
      // A `delegate` (or `collect`) result: the sub-agent's session, for good.
      this.childOf(p.callId, { agentId: meta.agent_id, sessionId: meta.session_id, state: meta.state, steps: meta.steps });
    }
    this.timeline(tool.step);
  }

  /**
   * The sub-agent a tool call runs, in the call's box: a link to its session and how
   * far it got (live `child_progress` events, then the result's meta).
   */
  childOf(callId, { agentId, sessionId, state, step, steps, text }) {
    const tool = this.tools.get(callId);
    if (!tool || !sessionId) return false;
    const shown = tool.child.dataset.state;
    if (state === "running" && shown && shown !== "running") return false; // it ended already
    const where = `#/session/${encodeURIComponent(sessionId)}`;
    const progress = state === "running" ? `step ${step || "?"} done, running` : `${state || "?"}${steps ? ` after ${steps} steps` : ""}`;
    const said = text ? [h("span", { class: "child-text" }, ` · “${text}”`)] : [];
    tool.child.replaceChildren(
      h("span", { class: "label" }, "sub-agent"),
      h("strong", {}, agentId || "?"), " · ",
      h("a", { class: "child-session", href: where }, `session ${sessionId}`), " · ",
      h("span", { class: "child-state" }, progress),
      ...said,
    );
    tool.child.dataset.state = state || "";
    tool.child.hidden = false;
    return true;
  }

  /** A tool call waiting for approval: shown in the call's box, where it landed. */
  on_approvalRequested(event, p) {
    this.ensure(p.turn, p.step);
    const expires = p.expireTime ? new Date(millis(p.expireTime)).toLocaleTimeString() : "";
    const row = this.row(
      event, "approval-requested", "approval requested",
      `${p.toolName || "?"}${p.reason ? `: ${p.reason}` : ""} (asked by ${p.requestedBy || "?"}`,
      expires ? `, expires ${expires})` : ")",
    );
    row.dataset.approval = p.approvalId || "";
    const tool = this.tools.get(p.callId);
    if (tool) {
      tool.state.textContent = "waiting for approval";
      tool.result.before(row);
    } else {
      this.container().append(row);
    }
  }

  /** How an approval ended and who answered: `api[:via]`, `plugin:NAME` or `server`. */
  on_approvalResolved(event, p) {
    this.ensure(p.turn, p.step);
    const how = approvalOutcome(p.outcome);
    const row = this.row(
      event, `approval-resolved ${how.replaceAll(" ", "-")}`, "approval",
      h("strong", { class: "outcome" }, how), ` by ${p.resolvedBy || "?"}`,
      p.reason ? `: ${p.reason}` : "",
    );
    row.dataset.approval = p.approvalId || "";
    const tool = this.tools.get(p.callId);
    if (tool) {
      if (tool.state.textContent === "waiting for approval") tool.state.textContent = how === "allowed once" ? "running" : how;
      tool.result.before(row);
    } else {
      this.container().append(row);
    }
  }

  /**
   * Bars of a step's tool calls on one time axis: parallel calls overlap. A result that
   * says when its tool ran (`start_time`, `end_time`) is drawn over that span, its own
   * duration, however long it then waited to be committed in model order; a result
   * without them (refused before it ran, or stored before they existed) spans its
   * call's event to its own.
   */
  timeline(step) {
    const started = step.tools.filter((t) => !Number.isNaN(t.start));
    if (!started.length) return;
    const origin = Math.min(...started.map((t) => t.start));
    const last = Math.max(this.latest, ...started.map((t) => Math.max(t.start, t.end || 0, t.ranEnd || 0)));
    const span = Math.max(1, last - origin);
    for (const tool of started) {
      const ran = !Number.isNaN(tool.ranStart) && !Number.isNaN(tool.ranEnd);
      const from = ran ? tool.ranStart : tool.start;
      const to = ran ? tool.ranEnd : Number.isNaN(tool.end) ? last : tool.end;
      tool.bar.style.marginLeft = `${((from - origin) / span) * 100}%`;
      tool.bar.style.width = `${Math.max(1, ((to - from) / span) * 100)}%`;
      let words;
      if (ran) {
        const waited = tool.end - tool.ranEnd;
        words = `ran ${seconds(to - from)} from +${seconds(from - origin)}` +
          (waited >= 1 ? `, committed ${seconds(waited)} later in model order` : "");
      } else if (Number.isNaN(tool.end)) {
        words = `called +${seconds(tool.start - origin)}, running`;
      } else {
        words = `called +${seconds(tool.start - origin)}, result recorded after ${seconds(tool.end - tool.start)}`;
      }
      tool.timing.textContent = words;
    }
  }

  on_stepEnd(event, p, time) {
    this.ensure(p.turn, p.step);
    if (this.step) this.step.stats.textContent = `· ${figures(this.step, time)}`;
    this.step.body.append(this.row(event, "step-end", "step end", ""));
    this.step = null;
  }

  on_turnEnd(event, p, time) {
    this.ensure(p.turn, 0);
    const words = endReason(p.reason);
    if (this.turn) this.turn.stats.textContent = figures(this.turn, time);
    this.turnsEnded += 1;
    this.showTotals();
    this.step = null;
    const fork = this.fork ? h("button", { type: "button", class: "fork", "data-seq": event.seq }, "Fork after this turn…") : null;
    if (fork) fork.addEventListener("click", () => this.fork(Number(event.seq)));
    this.turn.body.append(this.row(event, "turn-end", "turn end", h("strong", { class: "end-reason" }, words), fork ? " " : null, fork));
    this.turn.end.textContent = words;
    this.turn.element.dataset.end = Object.keys(p.reason || {})[0] || "";
    this.turn.ended = true;
  }

  /** Fold every turn but the last `keep` (and the one holding `seq`). */
  fold(keep, seq) {
    const turns = [...this.root.querySelectorAll("details.turn")];
    turns.slice(0, Math.max(0, turns.length - keep)).forEach((t) => {
      t.open = Boolean(seq && t.querySelector(`[data-seq="${seq}"]`));
    });
  }
}
