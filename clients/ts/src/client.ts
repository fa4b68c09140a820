/**
 * The facade: one verb per RPC (the Python client's verbs, in camelCase), typed
 * options, typed errors. The raw Connect clients (`factory`, `agents`, `registry`) stay
 * available for anything else.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromDate, type Any } from "@bufbuild/protobuf/wkt";
import { createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { FailurePolicy } from "./gen/agentloop/plugin/v1/hook_service_pb.js";
import {
  PluginRegistryService,
  type Plugin,
  type ToolSource,
  type UnregisterPluginResponse,
} from "./gen/agentloop/plugin/v1/plugin_registry_service_pb.js";
import { AgentFactoryService, type DrainReplicaResponse, type StreamAgentEventsResponse } from "./gen/agentloop/v1/agent_factory_service_pb.js";
import { AgentOptionsSchema, type Agent, type AgentOptions } from "./gen/agentloop/v1/agent_pb.js";
import {
  AgentService,
  type CancelTurnResponse,
  type CompactAgentResponse,
  type DeleteSessionResponse,
  type InjectContextResponse,
  type SteerMessageResponse,
  type WaitIdleResponse,
} from "./gen/agentloop/v1/agent_service_pb.js";
import { ApprovalDecision, type ApprovalRequested, type ApprovalResolved } from "./gen/agentloop/v1/approval_pb.js";
import type { SessionEvent } from "./gen/agentloop/v1/session_event_pb.js";
import type { Session } from "./gen/agentloop/v1/session_pb.js";
import { Conversation } from "./conversation.js";
import { AgentloopError, call } from "./errors.js";
import { retryUnavailable } from "./retrying.js";
import { SessionStream, type SessionSelector, type StreamOptions } from "./stream.js";
import { Turn } from "./turn.js";

/** How to reach the server. */
export interface ConnectOptions {
  /** The server's bearer token, sent on every call. */
  token?: string;
  /** TLS: `true` with the system roots, or PEM roots the server's certificate chains to. */
  tls?: boolean | { ca: string | Buffer };
  /** The deadline of each unary call of the verbs, in seconds (none by default). */
  timeout?: number;
}

/** The fields of `AgentOptions` that `create` and `resume` take. */
export interface OptionFields {
  /** The options to start from (each other field given is set on top). */
  options?: MessageInitShape<typeof AgentOptionsSchema>;
  /** A provider name (`scripted`, or one under `providers` in the server's config). */
  provider?: string;
  /** The provider's model name. */
  model?: string;
  /** The tools the agent may call (built-in ones, or tools plugins bring). */
  tools?: string[];
  /** The system prompt's persona (`{{provider}}`, `{{model}}`, `{{cwd}}` expand). */
  persona?: string;
  /** Parallel-safe tool calls run at once in a step (1: serial). */
  maxParallelToolCalls?: number;
  /** Tools whose every call waits for a person's approval. */
  approvalRequiredTools?: string[];
  /** Seconds a tool call waits for approval before it is refused. */
  approvalTimeout?: number;
  /** The provider's own options (such as `scriptedOptions(...)`), packed in an `Any`. */
  providerOptions?: Any;
}

/** `create`'s options: the agent's options, its session id and working directory. */
export type CreateOptions = OptionFields & { sessionId?: string; cwd?: string };

/** `send`'s options. */
export interface SendOptions {
  /** The message's request id (a new one unless given): a retry never queues it twice. */
  requestId?: string;
  /** Steer the running turn (when idle: an ordinary message). */
  steer?: boolean;
  /** A stream of the agent's session to read the turn from (see `conversation`). */
  stream?: SessionStream;
}

/** `listSessions`' filters (each optional; given ones must all hold), as `ListSessionsRequest`'s. */
export interface ListSessionsFilters {
  /** The sessions this agent drives now or drove last. */
  agentId?: string;
  /** Only those a live agent drives (true) or those none drives (false). */
  live?: boolean;
  /** Created at or after this time. */
  createdAfter?: Date;
  /** Created before this time. */
  createdBefore?: Date;
  /** How the last turn ended: a `TurnEndReason` kind ("completed", "error", …) or "none". */
  endReason?: string;
  /** Text the session id contains, ignoring case. */
  idContains?: string;
}

function timestampOf(at: Date | undefined) {
  return at === undefined ? undefined : timestampFromDate(at);
}

function agentOptions(fields: OptionFields): AgentOptions | undefined {
  const { options, approvalTimeout, ...rest } = fields;
  const given = Object.entries(rest).filter(([, value]) => value !== undefined);
  if (!options && !given.length && approvalTimeout === undefined) return undefined;
  const merged = create(AgentOptionsSchema, options ?? {});
  Object.assign(merged, Object.fromEntries(given));
  if (approvalTimeout !== undefined) merged.approvalTimeout = duration(approvalTimeout);
  return merged;
}

function duration(seconds: number): { $typeName: "google.protobuf.Duration"; seconds: bigint; nanos: number } {
  const whole = Math.floor(seconds);
  return { $typeName: "google.protobuf.Duration", seconds: BigInt(whole), nanos: Math.round((seconds - whole) * 1e9) };
}

/** A new request id. */
function newId(): string {
  return crypto.randomUUID();
}

function selector(of: SessionSelector) {
  if (Boolean(of.agentId) === Boolean(of.sessionId)) throw new Error("give exactly one of agentId or sessionId");
  return of.agentId
    ? { case: "agentId" as const, value: of.agentId }
    : { case: "sessionId" as const, value: of.sessionId! };
}

/** A client of one server: the raw Connect clients and a verb per RPC. */
export class AgentloopClient {
  readonly agents: Client<typeof AgentService>;
  readonly factory: Client<typeof AgentFactoryService>;
  readonly registry: Client<typeof PluginRegistryService>;
  readonly #sessions: Http2SessionManager;
  readonly #timeoutMs?: number;

  constructor(address: string, options: ConnectOptions = {}) {
    const interceptors: Interceptor[] = [retryUnavailable()];
    if (options.token) {
      const bearer = `Bearer ${options.token}`;
      interceptors.push((next) => (request) => {
        request.header.set("authorization", bearer);
        return next(request);
      });
    }
    const tls = options.tls;
    const baseUrl = `${tls ? "https" : "http"}://${address}`;
    this.#sessions = new Http2SessionManager(baseUrl, {}, typeof tls === "object" ? { ca: tls.ca } : {});
    const transport = createGrpcTransport({ baseUrl, interceptors, sessionManager: this.#sessions });
    this.agents = createClient(AgentService, transport);
    this.factory = createClient(AgentFactoryService, transport);
    this.registry = createClient(PluginRegistryService, transport);
    this.#timeoutMs = options.timeout === undefined ? undefined : options.timeout * 1000;
  }

  get #call() {
    return { timeoutMs: this.#timeoutMs };
  }

  /** Close the connection (open streams end). */
  close(): void {
    this.#sessions.abort();
  }

  // Agents (AgentFactoryService).

  /** Create an agent on a new session (`sessionId`: its id, else a new one). */
  async create(agentId: string, options: CreateOptions = {}): Promise<Agent> {
    const { sessionId = "", cwd = "", ...fields } = options;
    const request = { agentId, sessionId, options: agentOptions(fields), metadata: { cwd } };
    return (await call(this.factory.createAgent(request, this.#call))).agent!;
  }

  /** An agent over a stored session; without options, the session's stored ones. */
  async resume(agentId: string, sessionId: string, options: OptionFields = {}): Promise<Agent> {
    const request = { agentId, sessionId, options: agentOptions(options) };
    return (await call(this.factory.resumeAgent(request, this.#call))).agent!;
  }

  /** Dispose an agent; its session stays readable. */
  async dispose(agentId: string): Promise<Agent> {
    return (await call(this.factory.disposeAgent({ agentId }, this.#call))).agent!;
  }

  /** A live agent: its session, status, options and pending approvals. */
  async getAgent(agentId: string): Promise<Agent> {
    return (await call(this.factory.getAgent({ agentId }, this.#call))).agent!;
  }

  /** Every live agent (only the children of `parentAgentId`, when given), all pages. */
  async listAgents(parentAgentId = ""): Promise<Agent[]> {
    const agents: Agent[] = [];
    let pageToken = "";
    do {
      const page = await call(this.factory.listAgents({ pageToken, parentAgentId }, this.#call));
      agents.push(...page.agents);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return agents;
  }

  /**
   * Hand a replica's agents over to the other replicas between turns; it stops then
   * (`replicaId`: its id, "" for the replica this client talks to).
   */
  async drain(replicaId = ""): Promise<DrainReplicaResponse> {
    return call(this.factory.drainReplica({ replicaId }, this.#call));
  }

  /**
   * Every agent's live events and turn ends, server-wide, as they happen. Nothing is
   * replayed: the first response has `subscribed` set (read `listAgents` after it for
   * the state the events apply to). It ends when the server stops; `signal` stops it.
   */
  async *streamAgentEvents({ signal }: { signal?: AbortSignal } = {}): AsyncGenerator<StreamAgentEventsResponse> {
    try {
      yield* this.factory.streamAgentEvents({}, { signal });
    } catch (error) {
      throw AgentloopError.of(error);
    }
  }

  // Messages (AgentService).

  /** Send a message; the turn that answers it (iterate it, or `await turn.view()`). */
  async send(agentId: string, text: string, options: SendOptions = {}): Promise<Turn> {
    const requestId = options.requestId ?? newId();
    let nextSeq: bigint;
    let steering = false;
    if (options.steer) {
      const steered = await this.steer(agentId, text, { requestId });
      [nextSeq, steering] = [steered.nextSeq, steered.steering];
    } else {
      nextSeq = (await call(this.agents.sendMessage({ agentId, text, requestId }, this.#call))).nextSeq;
    }
    const turn = new Turn(this.agents, agentId, requestId, nextSeq, options.stream);
    turn.steering = steering;
    return turn;
  }

  /** Steer the running turn (when idle: a message, answered by the next turn). */
  async steer(agentId: string, text: string, { requestId = newId() }: { requestId?: string } = {}): Promise<SteerMessageResponse> {
    return call(this.agents.steerMessage({ agentId, text, requestId }, this.#call));
  }

  /** Add context without running the model. */
  async inject(agentId: string, text: string, { requestId = newId() }: { requestId?: string } = {}): Promise<InjectContextResponse> {
    return call(this.agents.injectContext({ agentId, text, requestId }, this.#call));
  }

  /** Cancel the running turn and drop what is queued. */
  async cancel(agentId: string, reason = ""): Promise<CancelTurnResponse> {
    return call(this.agents.cancelTurn({ agentId, reason }, this.#call));
  }

  /** Wait until the agent has nothing running or queued (at most `seconds`, server-side). */
  async waitIdle(agentId: string, seconds = 30): Promise<WaitIdleResponse> {
    const timeoutMs = this.#timeoutMs === undefined ? undefined : this.#timeoutMs + seconds * 1000;
    return call(this.agents.waitIdle({ agentId, timeout: duration(seconds) }, { timeoutMs }));
  }

  /** Message after message to one agent over one stream of its session. */
  conversation(agentId: string): Conversation {
    return new Conversation(this, agentId);
  }

  // Sessions (AgentService).

  /** A session by its live agent's id or by its own id. */
  async getSession(of: SessionSelector): Promise<Session> {
    return (await call(this.agents.getSession({ selector: selector(of) }, this.#call))).session!;
  }

  /** The stored sessions that pass every filter given, following the pages. */
  async listSessions(filters: ListSessionsFilters = {}): Promise<Session[]> {
    const sessions: Session[] = [];
    const request = {
      agentId: filters.agentId ?? "",
      live: filters.live,
      createdAfter: timestampOf(filters.createdAfter),
      createdBefore: timestampOf(filters.createdBefore),
      endReason: filters.endReason ?? "",
      idContains: filters.idContains ?? "",
    };
    let pageToken = "";
    do {
      const page = await call(this.agents.listSessions({ ...request, pageToken }, this.#call));
      sessions.push(...page.sessions);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return sessions;
  }

  /** A session's stored events from `fromSeq`, following the pages. */
  async listEvents(of: SessionSelector & { fromSeq?: bigint | number }): Promise<SessionEvent[]> {
    const events: SessionEvent[] = [];
    const fromSeq = BigInt(of.fromSeq ?? 0);
    let pageToken = "";
    do {
      const request = { selector: selector(of), fromSeq, pageToken };
      const page = await call(this.agents.listSessionEvents(request, this.#call));
      events.push(...page.events);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return events;
  }

  /** A session's events from `fromSeq`, reconnecting after a failure. */
  stream(options: StreamOptions): SessionStream {
    return new SessionStream(this.agents, options);
  }

  /**
   * Delete a stored session for good (its forks stay). Refused with FAILED_PRECONDITION
   * while a live agent drives it, unless `disposeAgent`: then that agent is disposed first.
   */
  async deleteSession(
    sessionId: string,
    { disposeAgent = false, requestId = "" }: { disposeAgent?: boolean; requestId?: string } = {},
  ): Promise<DeleteSessionResponse> {
    const request = { sessionId, disposeAgent, requestId };
    return await call(this.agents.deleteSession(request, this.#call));
  }

  /**
   * Summarise the idle agent's older history (CompactAgent): a summary replaces it in
   * the model's context, recorded in the session; retried safely by `requestId`.
   */
  async compact(
    agentId: string,
    {
      instructions = "",
      keepRecentTokens,
      requestId = newId(),
    }: { instructions?: string; keepRecentTokens?: bigint | number; requestId?: string } = {},
  ): Promise<CompactAgentResponse> {
    const keep = keepRecentTokens === undefined ? undefined : BigInt(keepRecentTokens);
    const request = { agentId, instructions, keepRecentTokens: keep, requestId };
    return await call(this.agents.compactAgent(request, this.#call));
  }

  /** A new stored session with `sessionId`'s events up to a `turnEnd`. */
  async fork(
    sessionId: string,
    { boundarySeq, newSessionId = "" }: { boundarySeq?: bigint | number; newSessionId?: string } = {},
  ): Promise<Session> {
    const boundary = boundarySeq === undefined ? undefined : BigInt(boundarySeq);
    const request = { sessionId, boundarySeq: boundary, newSessionId };
    return (await call(this.agents.forkSession(request, this.#call))).session!;
  }

  // Approvals (AgentService).

  /** The agent's tool calls waiting for approval, oldest first. */
  async approvals(agentId: string): Promise<ApprovalRequested[]> {
    return (await call(this.agents.listApprovals({ agentId }, this.#call))).approvals;
  }

  /**
   * Allow a waiting tool call once, or reject it (`reason`: what the model sees). The
   * call carries a request id, so a retry returns the first answer; an approval answered
   * first by someone else is `FailedPrecondition` (reason APPROVAL_RESOLVED).
   */
  async resolveApproval(
    agentId: string,
    approvalId: string,
    {
      allow,
      reason = "",
      requestId = newId(),
      via = "",
    }: { allow: boolean; reason?: string; requestId?: string; via?: string },
  ): Promise<ApprovalResolved> {
    const decision = allow ? ApprovalDecision.ALLOW_ONCE : ApprovalDecision.REJECT;
    const request = { agentId, approvalId, decision, reason, requestId, via };
    return (await call(this.agents.resolveApproval(request, this.#call))).resolution!;
  }

  // Plugins (PluginRegistryService).

  /** The registered plugins, with their state and counters. */
  async plugins(): Promise<Plugin[]> {
    return (await call(this.registry.listPlugins({}, this.#call))).plugins;
  }

  /** The configured MCP servers: transport, endpoint, state, last error and tools. */
  async toolSources(): Promise<ToolSource[]> {
    return (await call(this.registry.listToolSources({}, this.#call))).sources;
  }

  /**
   * Register the plugin served at `address`; the server connects to it. `order`
   * overrides its own order, `deadline` (seconds) its per-call timeout.
   */
  async registerPlugin(
    address: string,
    {
      order,
      deadline,
      failurePolicy = FailurePolicy.UNSPECIFIED,
    }: { order?: number; deadline?: number; failurePolicy?: FailurePolicy } = {},
  ): Promise<Plugin> {
    const timeout = deadline === undefined ? undefined : duration(deadline);
    const request = { address, order, timeout, failurePolicy };
    return (await call(this.registry.registerPlugin(request, this.#call))).plugin!;
  }

  /** Unregister a plugin by name. */
  async unregisterPlugin(name: string): Promise<UnregisterPluginResponse> {
    return call(this.registry.unregisterPlugin({ name }, this.#call));
  }
}

/** A client of the server at `address` (host:port). */
export function connect(address: string, options: ConnectOptions = {}): AgentloopClient {
  return new AgentloopClient(address, options);
}
