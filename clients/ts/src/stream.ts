/**
 * A session's events from a sequence number, across reconnects.
 *
 * `StreamSessionEvents` delivers a session's events in order from `fromSeq`; when the
 * connection breaks, a new call from one past the last seq received continues exactly
 * where the old one ended (nothing lost, nothing repeated). `SessionStream` does that
 * for its reader, a batch or an event at a time.
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import type { AgentService, StreamSessionEventsResponse } from "./gen/agentloop/v1/agent_service_pb.js";
import type { SessionEvent } from "./gen/agentloop/v1/session_event_pb.js";
import { AgentloopError } from "./errors.js";
import { MAX_ATTEMPTS, retryDelay } from "./retrying.js";

/** Stream failures a reconnect may cure (a dropped connection, a restart). */
export const RETRYABLE = new Set([Code.Unavailable, Code.Internal, Code.Unknown]);

/** Consecutive failed reconnects before the error reaches the caller. */
export const RECONNECTS = 8;

/** Which session to read: a live agent's (with its live agent events) or a stored one. */
export type SessionSelector = { agentId: string; sessionId?: undefined } | { sessionId: string; agentId?: undefined };

/** What `SessionStream` reads: a session, from a seq, to the end of its log or live. */
export type StreamOptions = SessionSelector & { fromSeq?: bigint | number; replayOnly?: boolean };

/**
 * One session's events from `fromSeq`, reopened after a failure where it broke. Read
 * it a batch at a time (`batches()`) or an event at a time (`for await`), not both;
 * `close()` ends it (a stream by agent id follows the agent until it is disposed).
 */
export class SessionStream implements AsyncIterable<SessionEvent> {
  /** The seq the next call starts from: one past the last event received. */
  cursor: bigint;
  /** How many times the call was reopened after a failure. */
  reconnects = 0;
  /** True once the server ended the stream (replay done, or the agent disposed). */
  ended = false;
  /** True while a `Turn` reads it (a second turn then opens its own stream). */
  busy = false;
  /** True once a call was opened (before that, `cursor` may still be moved). */
  started = false;
  readonly #agents: Client<typeof AgentService>;
  readonly #options: StreamOptions;
  #call?: AsyncIterator<StreamSessionEventsResponse>;
  #abort?: AbortController;
  #held: SessionEvent[] = [];

  constructor(agents: Client<typeof AgentService>, options: StreamOptions) {
    if (Boolean(options.agentId) === Boolean(options.sessionId)) {
      throw new Error("SessionStream needs exactly one of agentId or sessionId");
    }
    this.#agents = agents;
    this.#options = options;
    this.cursor = BigInt(options.fromSeq ?? 0);
  }

  /** The seq of the next event `nextEvent()` returns (at the earliest). */
  get position(): bigint {
    return this.#held.length ? this.#held[0].seq : this.cursor;
  }

  #open(): AsyncIterator<StreamSessionEventsResponse> {
    this.started = true;
    this.#abort = new AbortController();
    const { agentId, sessionId, replayOnly = false } = this.#options;
    const selector = agentId
      ? { case: "agentId" as const, value: agentId }
      : { case: "sessionId" as const, value: sessionId! };
    return this.#agents
      .streamSessionEvents({ selector, fromSeq: this.cursor, replayOnly }, { signal: this.#abort.signal })
      [Symbol.asyncIterator]();
  }

  /** The next response; undefined once the server ended the stream. */
  async nextBatch(): Promise<StreamSessionEventsResponse | undefined> {
    let failures = 0;
    let moves = 0;
    while (!this.ended) {
      this.#call ??= this.#open();
      let next: IteratorResult<StreamSessionEventsResponse>;
      try {
        next = await this.#call.next();
      } catch (error) {
        this.#call = undefined;
        const code = ConnectError.from(error).code;
        // An agent moving or a database away: the server says when to come back, and
        // such waits do not use up the reconnects (the stream resumes from `cursor`).
        const told = retryDelay(error);
        if (told !== undefined && moves < MAX_ATTEMPTS) {
          moves += 1;
          this.reconnects += 1;
          await new Promise((resolve) => setTimeout(resolve, told * 1000 * (0.5 + Math.random() / 2)));
          continue;
        }
        if (!RETRYABLE.has(code) || failures >= RECONNECTS) throw AgentloopError.of(error);
        failures += 1;
        this.reconnects += 1;
        await new Promise((resolve) => setTimeout(resolve, Math.min(50 * 2 ** failures, 2000)));
        continue;
      }
      if (next.done) {
        this.#call = undefined;
        this.ended = true;
        return undefined;
      }
      const batch = next.value;
      if (batch.events.length) this.cursor = batch.events[batch.events.length - 1].seq + 1n;
      return batch;
    }
    return undefined;
  }

  /** Every response, across reconnects, until the server ends the stream. */
  async *batches(): AsyncGenerator<StreamSessionEventsResponse> {
    for (let batch = await this.nextBatch(); batch; batch = await this.nextBatch()) yield batch;
  }

  /** The next session event; undefined once the server ended the stream. */
  async nextEvent(): Promise<SessionEvent | undefined> {
    while (!this.#held.length) {
      const batch = await this.nextBatch();
      if (!batch) return undefined;
      this.#held.push(...batch.events);
    }
    return this.#held.shift();
  }

  /** Every event read and not yet taken, reading a batch when there is none. */
  async take(): Promise<SessionEvent[]> {
    while (!this.#held.length) {
      const batch = await this.nextBatch();
      if (!batch) return [];
      this.#held.push(...batch.events);
    }
    const events = this.#held;
    this.#held = [];
    return events;
  }

  /** Give back the unconsumed tail of what `take` returned (the next reads see it). */
  unread(events: SessionEvent[]): void {
    this.#held = [...events, ...this.#held];
  }

  async *[Symbol.asyncIterator](): AsyncIterator<SessionEvent> {
    for (let event = await this.nextEvent(); event; event = await this.nextEvent()) yield event;
  }

  /** End the call (a later read opens a new one from `cursor`). */
  close(): void {
    this.#abort?.abort();
    this.#call = undefined;
  }
}
