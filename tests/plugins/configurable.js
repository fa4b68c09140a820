'use strict';
/**
 * @file A test plugin whose behaviour is chosen on the command line (used by tests/e2e).
 * The Node twin of configurable.py, with the same flags:
 *
 *     node tests/plugins/configurable.js --listen 127.0.0.1:0 --name p1 --tag A --order 1
 *
 * `agent/prompt-submit` (when any of --tag, --context, --block, --slow, --hang):
 * --block REASON blocks; --slow SECONDS sleeps first and, when the call is withdrawn,
 * prints `cancelled CALL_ID` (and appends it to --cancel-file); --hang never answers;
 * --approver-wait: a `tools/approval` approver that never answers, and prints
 * `withdrawn APPROVAL_ID: REASON` when its call is withdrawn (the approval ended);
 * --tag TAG rewrites the text to `TEXT-TAG`; --context TEXT adds a context.
 * --continue-once forces one more step per turn; --deny-tool NAME (--deny-reason)
 * denies that tool at `tools/pre-execute`; --tool NAME (--tool-sleep SECONDS) is a
 * parallel-safe tool that sleeps, then returns `NAME done`. Every subscription takes
 * --order, --timeout and --fail-open; --token requires that bearer token.
 */

const fs = require('node:fs');
const path = require('node:path');
const { parseArgs } = require('node:util');

const sdk = require(path.join(__dirname, '..', '..', 'clients', 'node', 'plugin'));

const { values: args } = parseArgs({
  options: {
    listen: { type: 'string', default: '127.0.0.1:0' },
    name: { type: 'string', default: 'configurable-node' },
    token: { type: 'string', default: '' },
    order: { type: 'string', default: '0' },
    timeout: { type: 'string' },
    'fail-open': { type: 'boolean', default: false },
    tag: { type: 'string', default: '' },
    context: { type: 'string', default: '' },
    block: { type: 'string', default: '' },
    slow: { type: 'string', default: '0' },
    'cancel-file': { type: 'string', default: '' },
    hang: { type: 'boolean', default: false },
    'continue-once': { type: 'boolean', default: false },
    'deny-tool': { type: 'string', default: '' },
    'deny-reason': { type: 'string', default: 'denied by the test plugin' },
    tool: { type: 'string', default: '' },
    'tool-sleep': { type: 'string', default: '0.3' },
    'approver-wait': { type: 'boolean', default: false },
  },
});

/** Resolve after `seconds`, or reject when `signal` aborts. */
function sleep(seconds, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, seconds * 1000);
    signal.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason || new Error('aborted'));
    }, { once: true });
  });
}

const plugin = sdk.createPlugin({ name: args.name, version: 'test', token: args.token });
const options = {
  order: Number(args.order),
  failurePolicy: args['fail-open'] ? 'FAIL_OPEN' : 'FAIL_CLOSED',
};
if (args.timeout !== undefined) options.timeout = Number(args.timeout);
const source = { kind: 'plugin', name: args.name };
const slow = Number(args.slow);

if (args.tag || args.context || args.block || slow > 0 || args.hang) {
  plugin.promptSubmit(options, async (call, { signal }) => {
    if (args.hang) await new Promise(() => {});
    if (slow > 0) {
      try {
        await sleep(slow, signal);
      } catch (error) {
        const note = `cancelled ${call.callId}`;
        // The file first: a reader of the stdout line then finds the file written.
        if (args['cancel-file']) fs.appendFileSync(args['cancel-file'], `${note}\n`);
        process.stdout.write(`${note}\n`);
        throw error;
      }
    }
    if (args.block) return sdk.blockPrompt(args.block);
    const text = sdk.textOf(call.promptSubmit.content);
    const rewritten = args.tag ? `${text}-${args.tag}` : undefined;
    const contexts = args.context ? [sdk.context(args.context, source)] : [];
    if (rewritten === undefined && contexts.length === 0) return null;
    return sdk.allowPrompt(rewritten, contexts);
  });
}

if (args['continue-once']) {
  const continued = new Set();
  plugin.turnContinuation(options, async (call) => {
    const key = `${call.agentId}/${call.turn}`;
    if (continued.has(key)) return null;
    continued.add(key);
    return sdk.continueTurn();
  });
}

if (args['deny-tool']) {
  plugin.toolsPreExecute(options, async (call) => (
    call.toolPreExecute.invocation.name === args['deny-tool'] ? sdk.deny(args['deny-reason']) : null
  ));
}

if (args.tool) {
  plugin.tool(
    { name: args.tool, description: 'Sleeps, then answers.', parallelSafe: true },
    async (_args, _call, { signal }) => {
      await sleep(Number(args['tool-sleep']), signal);
      return `${args.tool} done`;
    },
  );
}

if (args['approver-wait']) {
  plugin.toolsApproval(async (call, { signal }) => {
    const { approvalId } = call.toolApproval.approval;
    await new Promise((resolve) => {
      signal.addEventListener('abort', () => {
        process.stdout.write(`withdrawn ${approvalId}: ${signal.reason.message}\n`);
        resolve();
      });
    });
    return undefined;
  });
}

plugin.run(args.listen).catch((error) => {
  console.error(error);
  process.exit(1);
});
