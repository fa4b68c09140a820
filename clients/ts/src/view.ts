/**
 * What a turn said and did, read off its events: text, tool calls with results, usage.
 *
 * A turn's stream interleaves the text of the model's answer with the argument JSON of
 * its tool calls (`blockDelta` carries both), and parallel tool calls finish in any
 * order. `TurnView` reads the turn's recorded events instead; `TextDeltas` picks the
 * text out of the stream while it streams.
 */
import { create } from "@bufbuild/protobuf";
import { UsageSchema, type ContentBlock, type Usage } from "./gen/agentloop/v1/content_pb.js";
import type { SessionEvent, ToolResult, TurnEndReason } from "./gen/agentloop/v1/session_event_pb.js";
import { BlockKind } from "./gen/agentloop/v1/stream_pb.js";

/** The text blocks of some content, joined ("" when there is none). */
export function textOf(blocks: ContentBlock[]): string {
  return blocks.map((b) => (b.block.case === "text" ? b.block.value.text : "")).join("");
}

/** One tool call of the turn and its result (undefined while it has none). */
export class ToolCallView {
  readonly callId: string;
  readonly name: string;
  /** The arguments as the model wrote them (JSON text). */
  readonly arguments: string;
  readonly step: number;
  readonly result?: ToolResult;

  constructor(callId: string, name: string, args: string, step: number, result?: ToolResult) {
    this.callId = callId;
    this.name = name;
    this.arguments = args;
    this.step = step;
    this.result = result;
  }

  /** The text of the result ("" without a result). */
  get resultText(): string {
    return this.result ? textOf(this.result.content) : "";
  }

  /** True when the tool failed (or was refused, timed out, cancelled). */
  get isError(): boolean {
    return this.result?.isError ?? false;
  }

  /** The arguments decoded from JSON (throws when they are not JSON). */
  parsedArguments(): unknown {
    return JSON.parse(this.arguments || "{}");
  }
}

/** A turn's text, tool calls, usage and end, from its events. */
export class TurnView {
  /** The turn's number in its session (0 when no `turnStart` was read). */
  turn = 0;
  /** The assistant's text over every step, one message per line; no tool arguments. */
  text = "";
  /** The text of the last assistant message (the answer after the tools ran). */
  finalText = "";
  /** Every tool call in the order the model made them, each with its result. */
  toolCalls: ToolCallView[] = [];
  /** Tokens over every step of the turn. */
  usage: Usage = create(UsageSchema);
  /** How many steps (model requests) the turn ran. */
  steps = 0;
  /**
   * `completed`, `maxTokens`, `aborted`, `error`, `disposed`, `rejected`, `interrupted`;
   * `dropped` when a cancel dropped the message; "" when the turn has not ended.
   */
  endReason = "";
  /** The end's own words: the abort or rejection reason, the error message. */
  endDetail = "";
  /** The `turnEnd` (or `messageDropped`) event. */
  end?: SessionEvent;

  /** The view of one turn's events (chunks are not needed and may be left out). */
  static of(events: Iterable<SessionEvent>): TurnView {
    const view = new TurnView();
    const texts: string[] = [];
    const calls: [string, string, string, number][] = [];
    const results = new Map<string, ToolResult>();
    for (const event of events) {
      const p = event.payload;
      if (p.case === "turnStart") view.turn = p.value.turn;
      else if (p.case === "stepStart") view.steps += 1;
      else if (p.case === "assistantMessage") {
        texts.push(textOf(p.value.content));
        const usage = p.value.usage;
        if (usage) {
          view.usage.inputTokens += usage.inputTokens;
          view.usage.outputTokens += usage.outputTokens;
          view.usage.cachedInputTokens += usage.cachedInputTokens;
        }
      } else if (p.case === "toolCall") calls.push([p.value.callId, p.value.name, p.value.arguments, p.value.step]);
      else if (p.case === "toolResult") results.set(p.value.callId, p.value);
      else if (p.case === "turnEnd") {
        view.end = event;
        [view.endReason, view.endDetail] = ending(p.value.reason);
      } else if (p.case === "messageDropped") {
        view.end = event;
        [view.endReason, view.endDetail] = ["dropped", p.value.reason];
      }
    }
    view.toolCalls = calls.map(([id, name, args, step]) => new ToolCallView(id, name, args, step, results.get(id)));
    const spoken = texts.filter((text) => text);
    view.text = spoken.join("\n");
    view.finalText = spoken.at(-1) ?? "";
    return view;
  }
}

function ending(reason?: TurnEndReason): [string, string] {
  const kind = reason?.kind;
  if (!kind?.case) return ["", ""];
  if (kind.case === "aborted" || kind.case === "rejected") return [kind.case, kind.value.reason];
  if (kind.case === "error") return [kind.case, kind.value.message];
  return [kind.case, ""];
}

/**
 * Picks the text deltas out of a stream of events (tool-call arguments left out):
 * `deltas.of(event)` is the text an `assistantChunk` adds to a text block, else "".
 */
export class TextDeltas {
  readonly #textBlocks = new Set<string>();

  /** The text `event` adds to the answer ("" when it adds none). */
  of(event: SessionEvent): string {
    if (event.payload.case !== "assistantChunk") return "";
    const { step, chunk } = event.payload.value;
    const c = chunk?.chunk;
    if (c?.case === "blockStart" && c.value.kind === BlockKind.TEXT) this.#textBlocks.add(`${step}:${c.value.index}`);
    else if (c?.case === "blockDelta" && this.#textBlocks.has(`${step}:${c.value.index}`)) return c.value.text;
    return "";
  }
}
