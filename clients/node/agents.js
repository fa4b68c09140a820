'use strict';
/**
 * @file The agents API for plugins: create a child of the calling agent, follow it,
 * collect its answer, dispose it (AgentFactoryService and AgentService, plain gRPC).
 *
 * The same objects as the plugin contract (`proto.js`: camelCase fields, enum names,
 * `longs: Number`). A plugin that builds a team connects back to the server with
 * `connectAgents(address)`:
 *
 *   const agents = connectAgents('127.0.0.1:50051');
 *   const child = await agents.createChild(call.agentId, 'helper', { provider: 'scripted' },
 *     { toolCallId: call.toolExecute.invocation.callId });
 *   const seq = await agents.send(child.agentId, 'count these words');
 *   const answer = await agents.follow(child.agentId, seq, (event) => ...);
 *   await agents.dispose(child.agentId);
 */

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { LOADER_OPTIONS, PROTO_DIR } = require('./proto');

const definition = protoLoader.loadSync(
  ['agentloop/v1/agent_factory_service.proto', 'agentloop/v1/agent_service.proto'],
  { ...LOADER_OPTIONS, includeDirs: [PROTO_DIR] },
);
const v1 = grpc.loadPackageDefinition(definition).agentloop.v1;

/** A unary call as a promise. */
function unary(client, method, request, metadata, deadlineSeconds) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + deadlineSeconds * 1000);
    client[method](request, metadata, { deadline }, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });
}

/** The text blocks of a message's content, joined. */
function textOf(content) {
  return content.map((block) => (block.text ? block.text.text : '')).join('');
}

/**
 * A client of the server's agents API.
 * @param {string} address the server's host:port
 * @param {{token?: string, credentials?: grpc.ChannelCredentials, timeoutSeconds?: number}} [options]
 */
function connectAgents(address, { token = '', credentials, timeoutSeconds = 30 } = {}) {
  const creds = credentials || grpc.credentials.createInsecure();
  const factory = new v1.AgentFactoryService(address, creds);
  const agents = new v1.AgentService(address, creds);
  const metadata = () => {
    const m = new grpc.Metadata();
    if (token) m.set('authorization', `Bearer ${token}`);
    return m;
  };
  const call = (client, method, request) =>
    unary(client, method, request, metadata(), timeoutSeconds);

  return {
    /**
     * Create `agentId` as a child of `parentId` (disposed with it, never outliving it).
     * @param {string} parentId the owner, a live agent
     * @param {string} agentId the child's id
     * @param {object} [options] its `AgentOptions`
     * @param {{toolCallId?: string, seed?: {sessionId: string, seq?: number}}} [more]
     *   the parent's tool call that made it; a session prefix its history starts from
     * @returns {Promise<object>} the child's `Agent`
     */
    async createChild(parentId, agentId, options = {}, { toolCallId = '', seed } = {}) {
      const request = { agentId, options, parent: { agentId: parentId, toolCallId } };
      if (seed) request.seed = seed;
      return (await call(factory, 'createAgent', request)).agent;
    },

    /** The live children of `parentId`. */
    async children(parentId) {
      return (await call(factory, 'listAgents', { parentAgentId: parentId })).agents;
    },

    /** Send `text` to `agentId`; the seq its answering turn's events start from. */
    async send(agentId, text) {
      return Number((await call(agents, 'sendMessage', { agentId, text })).nextSeq);
    },

    /**
     * Follow `agentId`'s session from `fromSeq` until a turn ends; each event goes to
     * `onEvent`. Resolves with the turn's last answer text and how the turn ended.
     * @returns {Promise<{text: string, ending: string, steps: number}>}
     */
    follow(agentId, fromSeq, onEvent = () => {}) {
      return new Promise((resolve, reject) => {
        const stream = agents.streamSessionEvents({ agentId, fromSeq }, metadata());
        let text = '';
        let steps = 0;
        let done = false;
        stream.on('data', (batch) => {
          for (const event of batch.events) {
            if (done) return;
            onEvent(event);
            if (event.payload === 'assistantMessage') {
              text = textOf(event.assistantMessage.content) || text;
            } else if (event.payload === 'stepEnd') {
              steps = event.stepEnd.step;
            } else if (event.payload === 'turnEnd') {
              done = true;
              stream.cancel();
              resolve({ text, ending: event.turnEnd.reason.kind, steps });
            }
          }
        });
        stream.on('error', (error) => {
          if (!done) reject(error);
        });
        stream.on('end', () => {
          if (!done) reject(new Error(`the stream of ${agentId} ended before its turn did`));
        });
      });
    },

    /** Dispose `agentId` (its children first); its session stays readable. */
    async dispose(agentId) {
      return (await call(factory, 'disposeAgent', { agentId })).agent;
    },

    /** Close the channels. */
    close() {
      factory.close();
      agents.close();
    },
  };
}

module.exports = { connectAgents, textOf };
