'use strict';
/**
 * @file Running one `HookCall` against a plugin's registrations.
 *
 * A seam handler's return value becomes the `HookResult` field of its seam; `null` or
 * `undefined` means "continue unchanged"; a throw becomes `HookResult.error`. A decision
 * built for another seam (see `decisions.js`) or one that does not serialize is
 * answered as an error rather than sent malformed. Observers get notifications, never
 * answered; their failures are logged.
 */

const decisions = require('./decisions');

const { failure } = decisions;
const { BY_PAYLOAD, HookService } = require('./proto');
const { callContext } = require('./trace');

const CONTENT_KINDS = ['text', 'toolCall', 'toolResult', 'reasoning'];

/** Whether `value` looks like an array of content blocks (`[{text: {text}}]`). */
function isContent(value) {
  return Array.isArray(value) && value.every((block) => block && typeof block === 'object'
    && Object.keys(block).filter((key) => CONTENT_KINDS.includes(key)).length === 1);
}

/**
 * A tool handler's return value as a `ToolOutput`: a string or content blocks are the
 * content, `toolOutput(...)`/`toolError(...)` are used as they are, anything else is
 * sent as JSON text.
 * @param {unknown} value
 */
function toolOutputOf(value) {
  if (value && value[decisions.SEAM_OF] === 'toolExecute') return value;
  if (value === null || value === undefined || typeof value === 'string') {
    return { content: decisions.blocks(value) };
  }
  if (isContent(value)) return { content: value };
  return { content: [decisions.textBlock(JSON.stringify(value))] };
}

/**
 * Run a plugin tool: parse the arguments, call the handler, shape its output.
 * @param {import('./plugin').Plugin} plugin
 * @param {object} call a `HookCall` with `toolExecute`
 * @param {AbortSignal} signal
 */
async function runTool(plugin, call, signal) {
  const { name, arguments: text } = call.toolExecute.invocation || {};
  const tool = plugin.tools.get(name);
  if (!tool) throw new Error(`plugin ${plugin.name} has no tool ${JSON.stringify(name)}`);
  let args;
  try {
    args = text && text.trim() ? JSON.parse(text) : {};
  } catch (error) { // the model's mistake: a result it sees
    return decisions.toolError(`invalid JSON arguments: ${error.message}`, 'INVALID_ARGUMENTS');
  }
  return toolOutputOf(await tool.handler(args, call, callContext(call, signal)));
}

/**
 * The answer to a call, before the serialization check.
 * @param {import('./plugin').Plugin} plugin
 * @param {object} call
 * @param {AbortSignal} signal
 * @returns {Promise<object|null>}
 */
async function answer(plugin, call, signal) {
  const payload = call.payload || '';
  const spec = BY_PAYLOAD.get(payload);
  const subscription = plugin.subscriptions.get(payload);
  const watching = Boolean(subscription && subscription.options.observeOnly);
  if (subscription && subscription.matches && !subscription.matches(call)) {
    // Outside its conditions (a server that sent it anyway): never handled.
    return spec && spec.answered && call.kind !== 'CALL_KIND_NOTIFICATION' ? { callId: call.callId } : null;
  }
  if (spec && (!spec.answered || call.kind === 'CALL_KIND_NOTIFICATION' || watching)) {
    if (subscription) {
      try {
        await subscription.handler(call, callContext(call, signal));
      } catch (error) {
        plugin.logger.error(`plugin ${plugin.name}: the ${payload} observer failed:`, error);
      }
    }
    // A watched seam sent as a call (a server without observe_only): "continue unchanged".
    return spec.answered && call.kind !== 'CALL_KIND_NOTIFICATION' ? { callId: call.callId } : null;
  }
  try {
    if (payload === 'toolExecute') {
      return { callId: call.callId, toolExecute: await runTool(plugin, call, signal) };
    }
    if (!subscription) { // a call it does not know: UNIMPLEMENTED, never silence
      const unknown = `plugin ${plugin.name} has no handler for ${payload || 'the call'}`;
      return decisions.failure(call.callId, unknown, decisions.UNIMPLEMENTED);
    }
    const decision = await subscription.handler(call, callContext(call, signal));
    if (decision === null || decision === undefined) return { callId: call.callId };
    const seamOf = decision[decisions.SEAM_OF];
    if (typeof decision !== 'object' || (seamOf !== undefined && seamOf !== payload)) {
      const kind = seamOf || typeof decision;
      throw new TypeError(`the ${payload} handler returned a ${kind} decision`);
    }
    return { callId: call.callId, [payload]: decision };
  } catch (error) {
    return failure(call.callId, (error && error.message) || String(error));
  }
}


/**
 * Run one call's handler. Never rejects: every failure is a `HookResult` with `error`.
 * @param {import('./plugin').Plugin} plugin
 * @param {object} call the `HookCall`
 * @param {AbortSignal} signal passed to the handler
 * @returns {Promise<object|null>} the `HookResult`, or null for a notification
 */
async function runCall(plugin, call, signal) {
  const result = await answer(plugin, call, signal);
  if (result === null) return null;
  try {
    HookService.service.Handle.responseSerialize({ result }); // what the stream will send
    return result;
  } catch (error) {
    return failure(call.callId, `malformed ${call.payload} result: ${error.message}`);
  }
}

module.exports = { runCall, toolOutputOf };
