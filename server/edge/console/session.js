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

export class SessionView {
  constructor(root, sessionId) {
    this.root = root;
    this.sessionId = sessionId;
    this.reset();
  }

  reset() {
    this.root.replaceChildren();
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

  openTurn(number, event) {
    const title = h("span", { class: "turn-title" }, `Turn ${number}`);
    const end = h("span", { class: "turn-end" }, "running");
    const summary = h("summary", {}, title, " · ", end);
    const body = h("div", { class: "turn-body" });
    const element = h("details", { class: "turn", open: true, "data-turn": number }, summary, body);
    if (event) summary.append(" ", h("a", { class: "seq", href: this.link(Number(event.seq)), tabindex: "-1" }, `#${event.seq}`));
    this.root.append(element);
    this.turn = { element, body, number, end, ended: false };
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

  openStep(number, event) {
    const heading = h("h3", { class: "step-title" }, `Step ${number}`);
    const body = h("div", { class: "step-body" });
    const element = h("section", { class: "step", "data-step": number }, heading, body);
    if (event) {
      element.title = `seq ${event.seq}`;
      element.dataset.seq = event.seq;
      heading.append(" ", h("a", { class: "seq", href: this.link(Number(event.seq)), tabindex: "-1" }, `#${event.seq}`));
    }
    (this.turn ? this.turn.body : this.root).append(element);
    this.step = { element, body, number, blocks: new Map(), tools: [], text: false };
  }

  apply(event) {
    const time = millis(event.createTime);
    if (!Number.isNaN(time)) this.latest = Math.max(this.latest, time);
    const [kind] = Object.keys(event).filter((k) => !["seq", "createTime", "surfaceOp", "sourceEventSeqs"].includes(k));
    const payload = event[kind] || {};
    const handler = this[`on_${kind}`];
    if (handler) handler.call(this, event, payload, time);
    else this.container().append(this.row(event, "other", kind));
  }

  on_turnStart(event, p) {
    this.openTurn(p.turn, event);
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

  on_stepStart(event, p) {
    this.ensure(p.turn, 0);
    this.openStep(p.step, event);
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
    const element = this.row(
      event, "tool", "tool call",
      h("strong", { class: "tool-name" }, name || "?"), " ", state, " ", timing,
      h("span", { class: "track", "aria-hidden": "true" }, bar),
      h("div", { class: "args-box" }, h("span", { class: "label" }, "arguments"), forming),
      result,
    );
    element.dataset.call = callId;
    if (!this.step) this.ensure(this.turn ? this.turn.number : 0, 1);
    this.step.body.append(element);
    tool = { element, state, timing, bar, forming, result, start: NaN, end: NaN, step: this.step };
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
    const failed = Boolean(p.isError);
    tool.state.textContent = failed ? "failed" : "done";
    tool.element.classList.remove("running");
    tool.element.classList.add(failed ? "failed" : "ok");
    const error = p.error && (p.error.name || p.error.code) ? ` (${[p.error.name, p.error.code].filter(Boolean).join(", ")})` : "";
    tool.result.replaceChildren(
      this.row(event, failed ? "tool-error" : "tool-result", failed ? `error${error}` : "result", h("pre", {}, textOf(p.content))),
    );
    this.timeline(tool.step);
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

  /** How an approval ended and who answered: `api`, `plugin:NAME` or `server`. */
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

  /** Bars of a step's tool calls on one time axis: parallel calls overlap. */
  timeline(step) {
    const started = step.tools.filter((t) => !Number.isNaN(t.start));
    if (!started.length) return;
    const origin = Math.min(...started.map((t) => t.start));
    const last = Math.max(this.latest, ...started.map((t) => (Number.isNaN(t.end) ? t.start : t.end)));
    const span = Math.max(1, last - origin);
    for (const tool of started) {
      const end = Number.isNaN(tool.end) ? last : tool.end;
      tool.bar.style.marginLeft = `${((tool.start - origin) / span) * 100}%`;
      tool.bar.style.width = `${Math.max(1, ((end - tool.start) / span) * 100)}%`;
      const took = Number.isNaN(tool.end) ? "running" : `result recorded after ${seconds(tool.end - tool.start)}`;
      tool.timing.textContent = `started +${seconds(tool.start - origin)}, ${took}`;
    }
  }

  on_stepEnd(event, p) {
    this.ensure(p.turn, p.step);
    this.step.body.append(this.row(event, "step-end", "step end", ""));
    this.step = null;
  }

  on_turnEnd(event, p) {
    this.ensure(p.turn, 0);
    const words = endReason(p.reason);
    this.step = null;
    this.turn.body.append(this.row(event, "turn-end", "turn end", h("strong", { class: "end-reason" }, words)));
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
