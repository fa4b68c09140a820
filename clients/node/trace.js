'use strict';
/**
 * @file The server's trace context on each call, and running a handler inside it.
 *
 * While the server traces, each call it sends (seam, tool and model calls) carries the
 * W3C trace context of its span of the call: `call.traceparent` (and `tracestate`).
 * Every handler's context has both (`{signal, traceparent, tracestate}`; empty strings
 * when the server does not trace). When `@opentelemetry/api` resolves from this
 * package (an optional peer dependency), the handler runs in an OpenTelemetry context
 * whose remote parent is the server's span, so spans it starts join the turn's trace;
 * that takes a context manager the application registered (the OpenTelemetry SDK's
 * does). Without it, handlers run as they are.
 */

/** `version-traceid-spanid-flags`, lower-case hex (W3C Trace Context). */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const INVALID_TRACE = '0'.repeat(32);
const INVALID_SPAN = '0'.repeat(16);

let otel; // undefined: not looked up yet; null: not resolvable

/** `@opentelemetry/api`, or null when it does not resolve (looked up once). */
function otelApi() {
  if (otel === undefined) {
    try {
      otel = require('@opentelemetry/api'); // eslint-disable-line global-require
    } catch {
      otel = null;
    }
  }
  return otel;
}

/**
 * The second argument of every handler: the call's abort signal and trace context.
 * @param {object} call the `HookCall`
 * @param {AbortSignal} signal
 * @returns {{signal: AbortSignal, traceparent: string, tracestate: string}}
 */
function callContext(call, signal) {
  return { signal, traceparent: call.traceparent || '', tracestate: call.tracestate || '' };
}

/**
 * The span context a `traceparent` names, or null when it is not a valid one.
 * @param {string} traceparent
 * @param {string} [tracestate]
 */
function spanContextOf(traceparent, tracestate = '') {
  const match = TRACEPARENT.exec(traceparent || '');
  if (!match || match[1] === 'ff' || match[2] === INVALID_TRACE || match[3] === INVALID_SPAN) {
    return null;
  }
  const spanContext = {
    traceId: match[2], spanId: match[3], traceFlags: parseInt(match[4], 16) & 0xff, isRemote: true,
  };
  const api = otelApi();
  if (tracestate && api && typeof api.createTraceState === 'function') {
    spanContext.traceState = api.createTraceState(tracestate);
  }
  return spanContext;
}

/**
 * Run `fn()` in the OpenTelemetry context of the call's remote parent span, when the
 * call has a valid `traceparent` and `@opentelemetry/api` resolves; else just run it.
 * @template T
 * @param {object} call the `HookCall`
 * @param {() => T} fn
 * @returns {T}
 */
function withTraceContext(call, fn) {
  if (!call.traceparent) return fn();
  const api = otelApi();
  const spanContext = api && spanContextOf(call.traceparent, call.tracestate);
  if (!spanContext) return fn();
  return api.context.with(api.trace.setSpanContext(api.context.active(), spanContext), fn);
}

module.exports = { callContext, spanContextOf, withTraceContext };
