'use strict';
/**
 * @file Write an agentloop plugin in Node.js: register seam handlers and tools, serve.
 *
 * ```js
 * const { createPlugin, blockPrompt, textOf } = require('@agentloop/plugin');
 * const plugin = createPlugin({ name: 'guard', version: '1.0' });
 * plugin.promptSubmit({ order: 10 }, async (call) =>
 *   (textOf(call.promptSubmit.content).includes('rm -rf') ? blockPrompt('no') : null));
 * plugin.tool({ name: 'reverse', parallelSafe: true }, async (args) =>
 *   [...args.text].reverse().join(''));
 * plugin.model({ provider: 'shouty', defaultModel: 'v1' }, async function* (call) {
 *   yield* textChunks(lastUserText(call.modelStream.messages).toUpperCase());
 *   yield finishChunk();
 * });
 * const port = await plugin.serve('127.0.0.1:0');
 * ```
 *
 * A seam handler receives the `HookCall` (camelCase fields, see `proto.js`) and a
 * context `{signal, traceparent, tracestate}`: the `AbortSignal` is aborted by the
 * server's `CancelCall` and at the call's deadline, after which no result is sent; the
 * trace context is the server's span of the call (with `@opentelemetry/api` installed,
 * the handler runs in it: see `trace.js`). It returns `null`/`undefined`
 * ("continue unchanged") or the seam's decision, built with the constructors of
 * `decisions.js` (re-exported here). A handler that throws answers `HookResult.error`
 * with the error's message. Observers (`onSessionEvent`, `onAgentEvent`,
 * `onToolResult`) receive notifications, never answered. A model handler streams the
 * answer of a model call (see `models.js`).
 *
 * Modules: `proto.js` (the contract), `decisions.js` (decisions and content helpers),
 * `models.js` (chunk helpers, running one model call), `calls.js` (running one call),
 * `stream.js` (the `Handle` stream and the token check), `trace.js` (trace context).
 */

const grpc = require('@grpc/grpc-js');
const decisions = require('./decisions');
const proto = require('./proto');
const models = require('./models');
const { runCall } = require('./calls');
const { CAPABILITY: CONDITIONS_CAPABILITY, callMatcher, conditionsOf } = require('./conditions');

/** The server's default `pluginMaxMessageBytes`: what a plugin must accept and may send. */
const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;
const {
  authorized, describeFor, refuse, serveStream,
} = require('./stream');

const NAME_PATTERN = /^[A-Za-z0-9._:-]{1,128}$/;
const FAILURE_POLICIES = ['FAIL_CLOSED', 'FAIL_OPEN'];

/**
 * @typedef {object} SubscriptionOptions
 * @property {number} [order=0] place among the seam's listeners, lower first
 * @property {number} [timeout] deadline of each call in seconds (default: the server's)
 * @property {'FAIL_CLOSED'|'FAIL_OPEN'} [failurePolicy] what a failed call does to the
 *   turn (default: FAIL_CLOSED, the turn ends with reason `error`)
 * @property {string[]} [agentIds] only these agents' calls (default: every agent)
 * @property {number} [bufferSize] observers only: notifications that may wait to be
 *   sent (default: the server's 1024)
 * @property {string[]} [eventKinds] onSessionEvent and onAgentEvent only: only these
 *   payload kinds, such as 'turn_end' or 'status' (default: all); the server
 *   filters, so other events cost nothing
 * @property {string[]} [tools] tool seams only (toolsPreExecute, toolsPostExecute,
 *   onToolResult, toolsApproval): only calls of these tools, by name or glob ('mcp__*')
 * @property {Object<string, string>} [agentLabels] only agents whose labels
 *   (`AgentOptions.labels`) hold all of these
 * @property {string} [promptPrefix] promptSubmit only: only prompts whose text starts so
 * @property {string} [promptRegex] promptSubmit only: only prompts whose text this regular
 *   expression is found in (the common subset of JavaScript and Python `re`: the server
 *   evaluates it with Python's)
 * @property {boolean} [observeOnly] transforming seams and checkpoints: the plugin only
 *   watches; the server sends each call as a notification and never waits for it (no
 *   round trip); the handler's return value is ignored (default: false)
 */

/**
 * @callback Handler
 * @param {object} call the `HookCall`: `callId`, `seam`, `agentId`, `sessionId`, `turn`,
 *   `step`, and the seam's payload (`call.promptSubmit`, `call.toolPreExecute`, ...)
 * @param {{signal: AbortSignal, traceparent: string, tracestate: string}} context aborted on
 *   `CancelCall` or at the deadline; `traceparent` and `tracestate` are the server's trace
 *   context of the call (empty when it does not trace; see `trace.js`)
 * @returns {Promise<object|null|undefined>|object|null|undefined} the decision, or nothing
 */

/**
 * @callback ToolHandler
 * @param {any} args the parsed JSON arguments
 * @param {object} call the `HookCall` (`call.toolExecute.invocation`)
 * @param {{signal: AbortSignal, traceparent: string, tracestate: string}} context aborted on
 *   `CancelCall` or at the deadline; `traceparent` and `tracestate` are the server's trace
 *   context of the call (empty when it does not trace; see `trace.js`)
 * @returns {Promise<any>|any} a string, content blocks, `toolOutput(...)` or
 *   `toolError(...)`, or any other JSON value (sent as JSON text)
 */

/** A plugin: its seam handlers and tools, served as an agentloop `HookService`. */
class Plugin {
  /** @param {{name: string, version?: string, token?: string, logger?: Console}} options */
  constructor({
    name, version = '', token = '', logger = console, maxMessageBytes = MAX_MESSAGE_BYTES,
  }) {
    if (!NAME_PATTERN.test(name || '')) {
      throw new Error(`plugin name ${JSON.stringify(name)}: 1-128 letters, digits, . _ : -`);
    }
    this.name = name;
    this.version = version;
    this.token = token || '';
    this.logger = logger;
    /** at least the server's `pluginMaxMessageBytes` (gRPC's default 4 MiB is below it) */
    this.maxMessageBytes = maxMessageBytes;
    /** @type {Map<string, {handler: Handler, options: SubscriptionOptions}>} by payload */
    this.subscriptions = new Map();
    /** @type {Map<string, {definition: object, handler: ToolHandler}>} by name */
    this.tools = new Map();
    /** @type {Map<string, {definition: object, handler: Function}>} by provider */
    this.models = new Map();
    /** The open `Handle` streams, each with `drain()`. */
    this.streams = new Set();
    this.server = null;
  }

  /**
   * `agent/prompt-submit`: return `allowPrompt(content, contexts)` or `blockPrompt(reason)`.
   * @param {SubscriptionOptions|Handler} options the options, or directly the handler
   * @param {Handler} [handler]
   * @returns {this}
   */
  promptSubmit(options, handler) {
    return this._subscribe('promptSubmit', options, handler);
  }

  /**
   * `agent/session-prefix`: return `replacePrefix(messages)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  sessionPrefix(options, handler) {
    return this._subscribe('sessionPrefix', options, handler);
  }

  /**
   * `agent/pre-step`: return `addContext(text)` or `addContexts(items)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  preStep(options, handler) {
    return this._subscribe('preStep', options, handler);
  }

  /**
   * `agent/request`: return `replaceConfig(call.request.config, changes)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  request(options, handler) {
    return this._subscribe('request', options, handler);
  }

  /**
   * `agent/step-result`: return `replaceMessage(message)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  stepResult(options, handler) {
    return this._subscribe('stepResult', options, handler);
  }

  /**
   * `agent/compact`: return `{ summary }` to write a compaction's summary.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  compact(options, handler) {
    return this._subscribe('compact', options, handler);
  }

  /**
   * `agent/turn-continuation`: return `continueTurn(reason)` or `stopTurn()`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  turnContinuation(options, handler) {
    return this._subscribe('turnContinuation', options, handler);
  }

  /**
   * `agent/turn-stop`: return `terminalStop()`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  turnStop(options, handler) {
    return this._subscribe('turnStop', options, handler);
  }

  /**
   * `tools/pre-execute`: return `allowTool()`, `deny(reason)` or `ask(reason)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  toolsPreExecute(options, handler) {
    return this._subscribe('toolPreExecute', options, handler);
  }

  /**
   * `tools/post-execute`: return `accept(content, contexts)` or `blockResult(feedback)`.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  toolsPostExecute(options, handler) {
    return this._subscribe('toolPostExecute', options, handler);
  }

  /**
   * Observer of every session event (`call.sessionEvent.event`, `.dropped`).
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  onSessionEvent(options, handler) {
    return this._subscribe('sessionEvent', options, handler);
  }

  /**
   * Observer of the live agent events (`call.agentEvent.event`, `.dropped`).
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  onAgentEvent(options, handler) {
    return this._subscribe('agentEvent', options, handler);
  }

  /**
   * Observer of every final tool result (`call.toolResult.invocation`, `.output`).
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  onToolResult(options, handler) {
    return this._subscribe('toolResult', options, handler);
  }

  /**
   * Approver of tool calls waiting for approval (`call.toolApproval.approval`: id,
   * tool name, arguments, reason, who asked): return `approveOnce()`,
   * `rejectTool(reason)`, or nothing to abstain. The first answer wins (this or
   * ResolveApproval); a call whose approval ended otherwise is cancelled. Without a
   * `timeout` it waits as long as the approval does.
   * @param {SubscriptionOptions|Handler} options @param {Handler} [handler] @returns {this}
   */
  toolsApproval(options, handler) {
    return this._subscribe('toolApproval', options, handler);
  }

  /** Register the one handler of the seam whose payload field is `payload`. */
  /**
   * Subscribe to any seam of the table, by its path (`'agent/request'`) or its `Seam`
   * name (`'SEAM_REQUEST'`), as its method would: a seam newer than this helper's
   * methods needs no code here.
   * @param {string} seam @param {SubscriptionOptions|Handler} options
   * @param {Handler} [handler] @returns {this}
   */
  on(seam, options, handler) {
    const spec = proto.SEAMS.find((s) => s.path === seam || s.seam === seam);
    if (!spec) throw new Error(`plugin ${this.name}: no seam ${seam} in the seam table`);
    return this._subscribe(spec.payload, options, handler);
  }

  _subscribe(payload, options, handler) {
    if (typeof options === 'function') [options, handler] = [{}, options];
    if (typeof handler !== 'function') throw new TypeError(`the ${payload} handler: not a function`);
    if (this.subscriptions.has(payload)) {
      throw new Error(`plugin ${this.name} already has a ${payload} handler`);
    }
    const policy = options.failurePolicy;
    if (policy !== undefined && !FAILURE_POLICIES.includes(policy)) {
      throw new Error(`failurePolicy: one of ${FAILURE_POLICIES.join(', ')}, not ${policy}`);
    }
    const matches = callMatcher(payload, options); // throws for conditions the server refuses
    this.subscriptions.set(payload, { handler, options: { ...options }, matches });
    return this;
  }

  /**
   * Provide a tool the model can call; its calls come through `Handle`.
   * @param {object} options
   * @param {string} options.name the tool name the model uses
   * @param {string} [options.description] what the tool does, for the model
   * @param {object} [options.schema] the JSON schema of the arguments (an object)
   * @param {boolean} [options.parallelSafe=false] may run in the parallel pool
   * @param {number} [options.timeout] deadline of each call in seconds
   * @param {string[]} [options.agentIds] only these agents may see it (default: every
   *   agent); either way an agent sees it only if it names it in `AgentOptions.tools`
   * @param {ToolHandler} handler
   * @returns {this}
   */
  tool({
    name, description = '', schema, parallelSafe = false, timeout, agentIds = [],
  }, handler) {
    if (!name || this.tools.has(name)) {
      throw new Error(`plugin ${this.name}: tool name ${JSON.stringify(name)} is empty or taken`);
    }
    if (typeof handler !== 'function') throw new TypeError(`the ${name} handler is not a function`);
    const definition = {
      name,
      description,
      inputSchema: decisions.toStruct(schema || { type: 'object', properties: {} }),
      parallelSafe,
      timeout: timeout === undefined ? null : proto.duration(timeout),
      agentIds: [...agentIds],
    };
    this.tools.set(name, { definition, handler });
    return this;
  }

  /**
   * Serve a model provider; agents select it with `AgentOptions.provider` and each of
   * their model calls streams through `Handle`.
   * @param {object} options
   * @param {string} options.provider the provider name (letters, digits, `.`, `_`, `:`, `-`)
   * @param {string} [options.defaultModel] the model of agents that name none
   * @param {number} [options.timeout] the longest silence between two chunks, in
   *   seconds (default: the server's, 60)
   * @param {import('./models').ModelHandler} handler
   * @returns {this}
   */
  model({ provider, defaultModel = '', timeout }, handler) {
    if (!NAME_PATTERN.test(provider || '') || this.models.has(provider)) {
      const shown = JSON.stringify(provider);
      throw new Error(`plugin ${this.name}: provider name ${shown} is invalid or taken`);
    }
    if (typeof handler !== 'function') {
      throw new TypeError(`the ${provider} handler is not a function`);
    }
    const definition = {
      provider,
      defaultModel,
      timeout: timeout === undefined ? null : proto.duration(timeout),
    };
    this.models.set(provider, { definition, handler });
    return this;
  }

  /** The `Describe` answer: name, version, subscriptions (in seam order), tools, models. */
  describe() {
    const subscriptions = proto.SEAMS.filter((spec) => this.subscriptions.has(spec.payload))
      .map((spec) => {
        const { options } = this.subscriptions.get(spec.payload);
        return {
          seam: spec.seam,
          order: options.order || 0,
          timeout: options.timeout === undefined ? null : proto.duration(options.timeout),
          failurePolicy: `FAILURE_POLICY_${options.failurePolicy || 'UNSPECIFIED'}`,
          agentIds: [...(options.agentIds || [])],
          // The older field, which every server reads; other seams' kinds are conditions.
          eventKinds: spec.payload === 'sessionEvent' ? [...(options.eventKinds || [])] : [],
          bufferSize: options.bufferSize || 0,
          observeOnly: Boolean(options.observeOnly),
          conditions: conditionsOf(spec.payload, options),
        };
      });
    // A server without match conditions would call it for everything: it must refuse it.
    const conditioned = subscriptions.some((subscription) => subscription.conditions);
    const tools = [...this.tools.values()].map((tool) => tool.definition);
    const modelDefinitions = [...this.models.values()].map((model) => model.definition);
    return {
      name: this.name,
      version: this.version,
      subscriptions,
      tools,
      models: modelDefinitions,
      protocolVersion: 1,
      capabilities: conditioned ? [CONDITIONS_CAPABILITY] : [],
    };
  }

  /**
   * Run one call as `Handle` does; never rejects. A `modelStream` call hands each
   * `StreamChunk` to `onChunk` as it is produced (the finish last) and resolves to
   * null, or to a `HookResult` with `error` when the model failed.
   * @param {object} call the `HookCall`
   * @param {AbortSignal} [signal] handed to the handler
   * @param {(chunk: object) => void} [onChunk] receives a model call's chunks
   * @returns {Promise<object|null>} the `HookResult`, or null when nothing is sent
   */
  handle(call, signal = new AbortController().signal, onChunk = () => {}) {
    if (call.payload === 'modelStream') {
      return models.runModel(this, call, signal, onChunk);
    }
    return runCall(this, call, signal);
  }

  /**
   * Start serving on `address` (`host:port`; port 0 picks a free one), in plaintext or,
   * with `tls`, over TLS (PEM certificate chain and key), which the server reaches as
   * `tls://host:port`; with `ca`, clients must also present a certificate it signed.
   * @param {string} [address='127.0.0.1:0']
   * @param {{tls?: {cert: string|Buffer, key: string|Buffer, ca?: string|Buffer}}} [options]
   * @returns {Promise<number>} the bound port
   */
  async serve(address = '127.0.0.1:0', { tls } = {}) {
    if (this.server) throw new Error(`plugin ${this.name} is already serving`);
    const server = new grpc.Server({
      'grpc.max_receive_message_length': this.maxMessageBytes,
      'grpc.max_send_message_length': this.maxMessageBytes,
    });
    server.addService(proto.HookService.service, {
      Describe: (call, callback) => {
        if (!authorized(this, call)) return callback(refuse(this));
        return callback(null, describeFor(this.describe(), call.request));
      },
      Handle: (stream) => serveStream(this, stream),
    });
    const port = await new Promise((resolve, reject) => {
      server.bindAsync(address, serverCredentials(tls), (error, bound) =>
        (error ? reject(error) : resolve(bound)));
    });
    this.server = server;
    return port;
  }

  /**
   * Stop: refuse new calls, answer those in flight, close the streams; whatever is
   * left after `grace` seconds is cancelled.
   * @param {{grace?: number}} [options]
   * @returns {Promise<void>}
   */
  async stop({ grace = 5 } = {}) {
    const { server } = this;
    this.server = null;
    if (!server) return;
    for (const stream of this.streams) stream.drain();
    await new Promise((resolve) => {
      const timer = setTimeout(() => server.forceShutdown(), grace * 1000);
      server.tryShutdown(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /**
   * Serve until SIGTERM or SIGINT, printing `plugin NAME listening on HOST:PORT` once
   * ready; then stop.
   * @param {string} address `host:port`
   * @returns {Promise<void>} settled once stopped
   */
  async run(address) {
    const port = await this.serve(address);
    const host = address.replace(/:[^:]*$/, '');
    process.stdout.write(`plugin ${this.name} listening on ${host}:${port}\n`);
    await new Promise((resolve) => {
      process.once('SIGTERM', resolve);
      process.once('SIGINT', resolve);
    });
    await this.stop();
  }
}

/**
 * Create a plugin.
 * @param {object} options
 * @param {string} options.name identifies the plugin: letters, digits, `.`, `_`, `:`, `-`
 * @param {string} [options.version] free-form, for operators
 * @param {string} [options.token] when set, the server must send
 *   `authorization: Bearer <token>` metadata (UNAUTHENTICATED otherwise)
 * @param {Console} [options.logger=console] where observer failures are reported
 * @param {number} [options.maxMessageBytes=16 MiB] gRPC message limits; at least the
 *   server's `pluginMaxMessageBytes`
 * @returns {Plugin}
 */
function createPlugin(options) {
  return new Plugin(options);
}

/**
 * The credentials of the plugin's port: plaintext, TLS, or mutual TLS with `ca`.
 * @param {{cert: string|Buffer, key: string|Buffer, ca?: string|Buffer}} [tls]
 * @returns {grpc.ServerCredentials}
 */
function serverCredentials(tls) {
  if (!tls) return grpc.ServerCredentials.createInsecure();
  const ca = tls.ca ? Buffer.from(tls.ca) : null;
  const pair = { private_key: Buffer.from(tls.key), cert_chain: Buffer.from(tls.cert) };
  return grpc.ServerCredentials.createSsl(ca, [pair], Boolean(ca));
}

module.exports = {
  ...decisions,
  finishChunk: models.finishChunk,
  lastUserText: models.lastUserText,
  textChunks: models.textChunks,
  toolCallChunks: models.toolCallChunks,
  usageChunk: models.usageChunk,
  HookService: proto.HookService,
  LOADER_OPTIONS: proto.LOADER_OPTIONS,
  PROTO_DIR: proto.PROTO_DIR,
  Plugin,
  SEAMS: proto.SEAMS,
  createPlugin,
  duration: proto.duration,
};
