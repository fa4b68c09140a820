// Notices: the one message box (#notice) under the header. A notice belongs to the route
// it was raised on (the token's, "auth", to every route): leaving the route takes it
// down, and a late answer of a route left says nothing.
import { ApiError } from "./api.js";

export const $ = (selector) => document.querySelector(selector);

let currentRoute = "";

/** The route the page shows (its hash): the scope of a notice raised now. */
export function routeNow() {
  return currentRoute;
}

/** The page moved to `hash`: the previous route's notice goes. */
export function enterRoute(hash) {
  currentRoute = hash;
  const box = $("#notice");
  if (box.dataset.route !== "") box.hidden = true;
}

/** Show `message` (kind: error, info, agent, auth) for the route `scope`. */
export function notify(message, kind = "error", scope = currentRoute) {
  if (scope !== currentRoute) return; // raised for a route the page has left
  const box = $("#notice");
  box.textContent = message;
  box.className = kind;
  box.dataset.route = kind === "auth" ? "" : scope;
  box.hidden = false;
}

/** Take the notice down (only one of `kind`, when given). */
export function clearNotice(kind) {
  const box = $("#notice");
  if (!kind || box.className === kind) box.hidden = true;
}

function explain(error, what) {
  if (!(error instanceof ApiError)) return `${what} failed: ${error.message || error}`;
  if (error.status === "UNAUTHENTICATED") {
    return `The server refused the token (${error.status}: ${error.message}). ` +
      "Enter the server's token in the Token field above.";
  }
  return `${what} failed: ${error.status}${error.reason ? ` (${error.reason})` : ""}: ${error.message}`;
}

/** Show why `what` failed. */
export function fail(error, what, scope = currentRoute) {
  notify(explain(error, what), error.status === "UNAUTHENTICATED" ? "auth" : "error", scope);
}
