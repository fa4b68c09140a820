/**
 * The turn that answers a message, found by its request id, and its events.
 *
 * `SendMessage` returns before the turn opens, and the turn that answers a message may
 * answer others too, or come after a turn already running. The message's `requestId`
 * is echoed on the event that records it (`userMessage`, `steeringMessage`,
 * `promptBlocked`, or `messageDropped` when a cancel dropped it), so the answering turn
 * is the one that holds that event. A turn reads its own stream, or one shared by the
 * turns of a conversation.
 */
import type { Client } from "@connectrpc/connect";
import type { AgentService } from "./gen/agentloop/v1/agent_service_pb.js";
import type { SessionEvent } from "./gen/agentloop/v1/session_event_pb.js";
import { SessionStream } from "./stream.js";
import { TextDeltas, TurnView } from "./view.js";

/** The events that record a message, each with the `requestId` of its call. */
const NAMING = new Set(["userMessage", "steeringMessage", "promptBlocked", "messageDropped"]);

/** The turn answering one message: iterate it for its events, up to `turnEnd`. */
export class Turn implements AsyncIterable<SessionEvent> {
  /** The `turnEnd` of the turn, once it was read. */
  end?: SessionEvent;
  /** The `messageDropped` event, when a cancel dropped the message instead. */
  dropped?: SessionEvent;
  /** How many times the stream was reopened after a failure. */
  reconnects = 0;
  /** For a steer: true when it joined the running turn (which answers it). */
  steering = false;
  readonly #agents: Client<typeof AgentService>;
  readonly #shared?: SessionStream;
  #seen: SessionEvent[] = [];

  constructor(
    agents: Client<typeof AgentService>,
    readonly agentId: string,
    readonly requestId: string,
    /** Where the answering turn's events start, at the earliest. */
    readonly nextSeq: bigint,
    stream?: SessionStream,
  ) {
    this.#agents = agents;
    this.#shared = stream;
  }

  [Symbol.asyncIterator](): AsyncIterator<SessionEvent> {
    return this.events();
  }

  /** The events of the answering turn, in order, ending with its `turnEnd`. */
  async *events(): AsyncGenerator<SessionEvent> {
    const [stream, own] = this.#source();
    const reconnects = stream.reconnects;
    stream.busy = true;
    try {
      for await (const event of this.#ours(stream)) {
        if (event.payload.case !== "assistantChunk") this.#seen.push(event);
        yield event;
      }
    } finally {
      stream.busy = false;
      this.reconnects += stream.reconnects - reconnects;
      if (own) stream.close();
    }
  }

  /** Read the turn to its end (what is left of it); its text, tool calls and usage. */
  async view(): Promise<TurnView> {
    if (!this.end && !this.dropped) for await (const _ of this.events());
    return TurnView.of(this.#seen);
  }

  /** The turn's answer as it streams: text deltas only, never tool arguments. */
  async *textDeltas(): AsyncGenerator<string> {
    const deltas = new TextDeltas();
    for await (const event of this.events()) {
      const text = deltas.of(event);
      if (text) yield text;
    }
  }

  /** Read the turn to its end; its `turnEnd` (or `messageDropped`). */
  async result(): Promise<SessionEvent> {
    if (!this.end && !this.dropped) for await (const _ of this.events());
    const found = this.end ?? this.dropped;
    if (!found) throw new Error("the stream ended before the turn did");
    return found;
  }

  /** The stream to read, and whether it is this turn's own (closed at the end). */
  #source(): [SessionStream, boolean] {
    const shared = this.#shared;
    if (shared && !shared.busy) {
      if (!shared.started && shared.cursor < this.nextSeq) shared.cursor = this.nextSeq;
      if (shared.position <= this.nextSeq) return [shared, false];
    }
    return [new SessionStream(this.#agents, { agentId: this.agentId, fromSeq: this.nextSeq }), true];
  }

  async *#ours(stream: SessionStream): AsyncGenerator<SessionEvent> {
    let pending: SessionEvent[] = []; // the open turn, until we know it is ours
    let ours = false;
    for (let events = await stream.take(); events.length; events = await stream.take()) {
      let rest = events.length;
      try {
        for (const event of events) {
          rest -= 1;
          if (event.seq < this.nextSeq) continue; // a shared stream: an earlier turn's
          const p = event.payload;
          if (p.case === "turnStart") {
            pending = [event];
            ours = false;
            continue;
          }
          if (!ours) {
            pending.push(event);
            if (p.case && NAMING.has(p.case) && (p.value as { requestId: string }).requestId === this.requestId) {
              if (p.case === "messageDropped") {
                this.dropped = event;
                yield event;
                return;
              }
              ours = true;
              yield* pending;
              pending = [];
            } else if (p.case === "turnEnd") {
              pending = [];
            }
            continue;
          }
          yield event;
          if (p.case === "turnEnd") {
            this.end = event;
            return;
          }
        }
      } finally {
        if (rest) stream.unread(events.slice(events.length - rest));
      }
    }
  }
}
