/**
 * The agentloop client for Node: the generated contract (protobuf-es), Connect over
 * gRPC, and a small facade whose `send()` returns the turn that answers the message.
 *
 *     const client = connect("127.0.0.1:50051");
 *     await client.create("demo");
 *     for await (const event of await client.send("demo", "hi")) console.log(event.payload.case);
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { anyPack, type Any } from "@bufbuild/protobuf/wkt";
import { ScriptedOptionsSchema, type ScriptedStepSchema } from "./gen/agentloop/v1/scripted_pb.js";
import { AgentFactoryService } from "./gen/agentloop/v1/agent_factory_service_pb.js";
import { AgentOptionsSchema, type Agent } from "./gen/agentloop/v1/agent_pb.js";
import {
  AgentService,
  type CancelTurnResponse,
  type WaitIdleResponse,
} from "./gen/agentloop/v1/agent_service_pb.js";
import type { SessionEvent } from "./gen/agentloop/v1/session_event_pb.js";
import {
  ApprovalDecision,
  type ApprovalRequested,
  type ApprovalResolved,
} from "./gen/agentloop/v1/approval_pb.js";

export * from "./gen/agentloop/v1/agent_pb.js";
export * from "./gen/agentloop/v1/agent_service_pb.js";
export * from "./gen/agentloop/v1/agent_factory_service_pb.js";
export * from "./gen/agentloop/v1/session_event_pb.js";
export * from "./gen/agentloop/v1/scripted_pb.js";
export * from "./gen/agentloop/v1/approval_pb.js";

/** How to reach the server. */
export interface ConnectOptions {
  /** The server's bearer token, sent on every call. */
  token?: string;
  /** TLS: `true` with the system roots, or PEM roots the server's certificate chains to. */
  tls?: boolean | { ca: string | Buffer };
}

/** Stream failures a reconnect may cure (a dropped connection, a restart). */
const RETRYABLE = new Set([Code.Unavailable, Code.Internal, Code.Unknown]);

/** Consecutive failed reconnects before the error reaches the caller. */
const RECONNECTS = 8;

/** A client of one server: the raw Connect clients and the common verbs. */
export class AgentloopClient {
  readonly agents: Client<typeof AgentService>;
  readonly factory: Client<typeof AgentFactoryService>;

  constructor(address: string, options: ConnectOptions = {}) {
    const interceptors: Interceptor[] = [];
    if (options.token) {
      const bearer = `Bearer ${options.token}`;
      interceptors.push((next) => (request) => {
        request.header.set("authorization", bearer);
        return next(request);
      });
    }
    const tls = options.tls;
    const transport = createGrpcTransport({
      baseUrl: `${tls ? "https" : "http"}://${address}`,
      interceptors,
      nodeOptions: typeof tls === "object" ? { ca: tls.ca } : {},
    });
    this.agents = createClient(AgentService, transport);
    this.factory = createClient(AgentFactoryService, transport);
  }

  /** Create an agent on a new session. */
  async create(
    agentId: string,
    options?: MessageInitShape<typeof AgentOptionsSchema>,
    sessionId = "",
  ): Promise<Agent> {
    const created = await this.factory.createAgent({
      agentId,
      sessionId,
      options: create(AgentOptionsSchema, options ?? {}),
    });
    return created.agent!;
  }

  /** An agent over a stored session; without options, the session's stored ones. */
  async resume(
    agentId: string,
    sessionId: string,
    options?: MessageInitShape<typeof AgentOptionsSchema>,
  ): Promise<Agent> {
    const resumed = await this.factory.resumeAgent({
      agentId,
      sessionId,
      options: options === undefined ? undefined : create(AgentOptionsSchema, options),
    });
    return resumed.agent!;
  }

  /** Dispose an agent; its session stays readable. */
  async dispose(agentId: string): Promise<Agent> {
    return (await this.factory.disposeAgent({ agentId })).agent!;
  }

  /** Send a message; the turn that answers it (iterate it for its events). */
  async send(agentId: string, text: string, requestId: string = crypto.randomUUID()): Promise<Turn> {
    const sent = await this.agents.sendMessage({ agentId, text, requestId });
    return new Turn(this, agentId, requestId, sent.nextSeq);
  }

  /** Cancel the running turn and drop what is queued. */
  async cancel(agentId: string, reason = ""): Promise<CancelTurnResponse> {
    return this.agents.cancelTurn({ agentId, reason });
  }

  /** The agent's tool calls waiting for approval, oldest first. */
  async approvals(agentId: string): Promise<ApprovalRequested[]> {
    return (await this.agents.listApprovals({ agentId })).approvals;
  }

  /**
   * Allow a waiting tool call once, or reject it (`reason`: what the model sees). The
   * call carries a request id, so a retry returns the first answer; an approval answered
   * first by someone else is FAILED_PRECONDITION (reason APPROVAL_RESOLVED).
   */
  async resolveApproval(
    agentId: string,
    approvalId: string,
    { allow, reason = "", requestId = crypto.randomUUID() }: { allow: boolean; reason?: string; requestId?: string },
  ): Promise<ApprovalResolved> {
    const decision = allow ? ApprovalDecision.ALLOW_ONCE : ApprovalDecision.REJECT;
    const answer = await this.agents.resolveApproval({ agentId, approvalId, decision, reason, requestId });
    return answer.resolution!;
  }

  /** Wait until the agent has nothing running or queued (at most `seconds`, server-side). */
  async waitIdle(agentId: string, seconds = 30): Promise<WaitIdleResponse> {
    return this.agents.waitIdle({ agentId, timeout: { seconds: BigInt(Math.floor(seconds)) } });
  }
}

/** `AgentOptions.providerOptions` for the scripted provider: one step per model call. */
export function scriptedOptions(steps: MessageInitShape<typeof ScriptedStepSchema>[]): Any {
  return anyPack(ScriptedOptionsSchema, create(ScriptedOptionsSchema, { steps }));
}

/** A client of the server at `address` (host:port). */
export function connect(address: string, options: ConnectOptions = {}): AgentloopClient {
  return new AgentloopClient(address, options);
}

/**
 * The turn that answers one message: the one whose `user_message` (or, when a cancel
 * dropped it, `message_dropped`) echoes the message's request id. Iterating yields its
 * events up to its `turn_end`; a broken stream is reopened from one past the last seq.
 */
export class Turn implements AsyncIterable<SessionEvent> {
  /** The `turn_end`, once read. */
  end?: SessionEvent;
  /** The `message_dropped` event, when the message was dropped instead. */
  dropped?: SessionEvent;
  /** How many times the stream was reopened after a failure. */
  reconnects = 0;

  constructor(
    private readonly client: AgentloopClient,
    readonly agentId: string,
    readonly requestId: string,
    readonly nextSeq: bigint,
  ) {}

  async *[Symbol.asyncIterator](): AsyncIterator<SessionEvent> {
    let pending: SessionEvent[] = [];
    let ours = false;
    for await (const event of this.stream()) {
      const kind = event.payload.case;
      if (kind === "turnStart") {
        pending = [event];
        ours = false;
        continue;
      }
      if (!ours) {
        pending.push(event);
        if (this.namesUs(event)) {
          if (kind === "messageDropped") {
            this.dropped = event;
            yield event;
            return;
          }
          ours = true;
          yield* pending;
          pending = [];
        } else if (kind === "turnEnd") {
          pending = [];
        }
        continue;
      }
      yield event;
      if (kind === "turnEnd") {
        this.end = event;
        return;
      }
    }
  }

  /** Read the turn to its end; its `turn_end` (or `message_dropped`). */
  async result(): Promise<SessionEvent> {
    for await (const _ of this) {
      // drain
    }
    const found = this.end ?? this.dropped;
    if (!found) throw new Error("the stream ended before the turn did");
    return found;
  }

  private namesUs(event: SessionEvent): boolean {
    const p = event.payload;
    if (p.case === "userMessage") return p.value.requestId === this.requestId;
    if (p.case === "messageDropped") return p.value.requestId === this.requestId;
    return false;
  }

  private async *stream(): AsyncGenerator<SessionEvent> {
    let cursor = this.nextSeq;
    let failures = 0;
    for (;;) {
      const controller = new AbortController();
      try {
        const batches = this.client.agents.streamSessionEvents(
          { selector: { case: "agentId", value: this.agentId }, fromSeq: cursor },
          { signal: controller.signal },
        );
        for await (const batch of batches) {
          failures = 0;
          for (const event of batch.events) {
            cursor = event.seq + 1n;
            yield event;
          }
        }
        return; // the agent was disposed and its log drained
      } catch (error) {
        const code = ConnectError.from(error).code;
        if (!RETRYABLE.has(code) || failures >= RECONNECTS) throw error;
        failures += 1;
        this.reconnects += 1;
        await new Promise((resolve) => setTimeout(resolve, Math.min(50 * 2 ** failures, 2000)));
      } finally {
        controller.abort();
      }
    }
  }
}
