'use strict';
/**
 * @file Match conditions: which calls of a subscription the plugin wants.
 *
 * The server evaluates a subscription's `conditions` before each call and does not make
 * the calls they exclude (no round trip). This module turns the options a handler is
 * registered with into the `MatchConditions` message, checks them early (a regex that
 * does not compile, a condition the seam does not take), and matches a call the way the
 * server does, so that a call sent anyway (a server that ignored them) is answered
 * "continue unchanged" without running the handler. Agent labels are known to the
 * server alone: they are not matched here.
 */

/** The capability a plugin with conditions requires of the server. */
const CAPABILITY = 'match_conditions';

const TOOL_PAYLOADS = ['toolPreExecute', 'toolPostExecute', 'toolResult', 'toolApproval'];
const EVENT_PAYLOADS = ['sessionEvent', 'agentEvent'];

/** Whether a tool pattern is a glob (`*`, `?`, `[...]`) rather than a name. */
const isGlob = (pattern) => /[*?[]/.test(pattern);

/**
 * A glob as an anchored regular expression: `*` any run, `?` one character, `[...]` a set
 * (`[!...]` its complement), everything else literal.
 * @param {string} glob
 */
function globRegExp(glob) {
  let source = '';
  for (let i = 0; i < glob.length; i += 1) {
    const char = glob[i];
    const close = char === '[' ? glob.indexOf(']', i + 2) : -1;
    if (char === '*') source += '[\\s\\S]*';
    else if (char === '?') source += '[\\s\\S]';
    else if (close > i) {
      let set = glob.slice(i + 1, close).replace(/\\/g, '\\\\');
      if (set.startsWith('!')) set = `^${set.slice(1)}`;
      source += `[${set}]`;
      i = close;
    } else source += char.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  }
  return new RegExp(`^(?:${source})$`);
}

/**
 * Whether a tool name is one of `patterns` (names, or globs matching the whole name).
 * @param {string[]} patterns
 * @returns {(name: string) => boolean}
 */
function nameMatcher(patterns) {
  const names = new Set(patterns.filter((p) => !isGlob(p)));
  const globs = patterns.filter(isGlob).map(globRegExp);
  return (name) => names.has(name) || globs.some((glob) => glob.test(name));
}

/**
 * The `MatchConditions` of a subscription's options, or null when it sets none. Throws
 * for a condition the seam does not take, an empty pattern or a regex that does not
 * compile: the server would refuse the plugin for them.
 * @param {string} payload the seam's payload field (camelCase)
 * @param {object} options the subscription's options
 */
function conditionsOf(payload, options) {
  const tools = [...(options.tools || [])];
  const agentLabels = { ...(options.agentLabels || {}) };
  const eventKinds = payload === 'sessionEvent' ? [] : [...(options.eventKinds || [])];
  const promptPrefix = options.promptPrefix || '';
  const promptRegex = options.promptRegex || '';
  const refuse = (field, why) => { throw new Error(`the ${payload} subscription: ${field}: ${why}`); };
  if (tools.length && !TOOL_PAYLOADS.includes(payload)) refuse('tools', 'tool seams only');
  if (tools.some((pattern) => !pattern)) refuse('tools', 'a pattern is empty');
  if (eventKinds.length && !EVENT_PAYLOADS.includes(payload)) {
    refuse('eventKinds', 'onSessionEvent and onAgentEvent only');
  }
  if ((promptPrefix || promptRegex) && payload !== 'promptSubmit') {
    refuse(promptPrefix ? 'promptPrefix' : 'promptRegex', 'promptSubmit only');
  }
  if (promptRegex) new RegExp(promptRegex); // throws a SyntaxError when it does not compile
  if (Object.keys(agentLabels).some((key) => !key)) refuse('agentLabels', 'a key is empty');
  const any = tools.length || eventKinds.length || promptPrefix || promptRegex
    || Object.keys(agentLabels).length;
  return any ? {
    tools, agentLabels, eventKinds, promptPrefix, promptRegex,
  } : null;
}

/** The snake_case name of a camelCase payload kind, as conditions name event kinds. */
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);

/** The text a prompt condition sees: the text blocks, joined by newlines. */
function promptText(content) {
  return (content || []).filter((block) => block.text).map((block) => block.text.text || '').join('\n');
}

/** The tool a tool seam's call is about. */
function toolName(call) {
  const body = call[call.payload] || {};
  if (call.payload === 'toolApproval') return (body.approval || {}).toolName || '';
  return (body.invocation || {}).name || '';
}

/**
 * A matcher of calls for one subscription, or null when every call matches.
 * @param {string} payload
 * @param {object} options the subscription's options
 * @returns {((call: object) => boolean) | null}
 */
function callMatcher(payload, options) {
  const conditions = conditionsOf(payload, options);
  if (!conditions) return null;
  const agentIds = new Set(options.agentIds || []);
  const kinds = new Set([...(options.eventKinds || [])]);
  const named = conditions.tools.length ? nameMatcher(conditions.tools) : null;
  const regex = conditions.promptRegex ? new RegExp(conditions.promptRegex) : null;
  return (call) => {
    if (agentIds.size && !agentIds.has(call.agentId)) return false;
    if (kinds.size && EVENT_PAYLOADS.includes(call.payload)) {
      const event = (call[call.payload] || {}).event || {};
      const kind = call.payload === 'sessionEvent' ? event.payload : event.event; // the oneofs
      if (!kinds.has(snake(kind || ''))) return false;
    }
    if (named && TOOL_PAYLOADS.includes(call.payload) && !named(toolName(call))) return false;
    if (call.payload === 'promptSubmit') {
      const text = promptText(call.promptSubmit.content);
      if (!text.startsWith(conditions.promptPrefix)) return false;
      if (regex && !regex.test(text)) return false;
    }
    return true;
  };
}

module.exports = {
  CAPABILITY, callMatcher, conditionsOf, globRegExp, nameMatcher, promptText,
};
