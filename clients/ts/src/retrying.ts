/**
 * Retry what the server says to retry: an agent between replicas, a database outage.
 *
 * A replicated server answers `UNAVAILABLE` with an `ErrorInfo` reason `AGENT_MOVING`
 * (the agent is between owners) or `STORE_UNAVAILABLE` (its database is away), and a
 * `RetryInfo` delay. `retryUnavailable`, an interceptor every client installs, makes
 * the same unary call again after that delay (jittered, until the call's deadline):
 * the same request message, so the same `requestId`, which the server accepts once.
 * Any other status, or a bare `UNAVAILABLE` (no reason: the server itself is
 * unreachable), is the caller's as before. Streams resume on their own (`stream.ts`).
 */
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { AgentloopError } from "./errors.js";

/** The `ErrorInfo` reasons a call is retried for. */
export const RETRIED_REASONS = new Set(["AGENT_MOVING", "STORE_UNAVAILABLE"]);

/** Seconds to wait when the server named no delay. */
export const DEFAULT_DELAY = 0.5;
/** The longest wait between two attempts, in seconds. */
export const MAX_DELAY = 5;
/** A call without a deadline is given up after this many attempts. */
export const MAX_ATTEMPTS = 50;

/** The seconds to wait before retrying `error`'s call, or undefined when it is not retried. */
export function retryDelay(error: unknown): number | undefined {
  if (!(error instanceof ConnectError) || error.code !== Code.Unavailable) return undefined;
  const typed = AgentloopError.of(error) as AgentloopError;
  if (!RETRIED_REASONS.has(typed.reason)) return undefined;
  return Math.min(Math.max(typed.retryDelay ?? DEFAULT_DELAY, 0), MAX_DELAY);
}

/** Wait `seconds`; false when `signal` (the call's deadline or abort) fired first. */
function pause(seconds: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const done = (waited: boolean) => {
      clearTimeout(timer);
      signal.removeEventListener("abort", aborted);
      resolve(waited);
    };
    const aborted = () => done(false);
    const timer = setTimeout(() => done(true), seconds * 1000);
    signal.addEventListener("abort", aborted);
  });
}

/** Retries unary calls refused with a retryable reason (see the module). */
export function retryUnavailable(): Interceptor {
  return (next) => async (request) => {
    if (request.stream) return next(request);
    for (let attempt = 1; ; attempt++) {
      try {
        return await next(request);
      } catch (error) {
        const delay = retryDelay(error);
        if (delay === undefined || attempt >= MAX_ATTEMPTS) throw error;
        // Jitter: many clients refused at once do not all come back at once.
        if (!(await pause(delay * (0.5 + Math.random() / 2), request.signal))) throw error;
      }
    }
  };
}
