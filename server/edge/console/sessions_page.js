// The sessions page (#/sessions?...): every stored and live session, searched and
// filtered by the server (ListSessions' filters), paged from it. The filters live in
// the address, so a filtered list can be linked to.
import { agents } from "./api.js";
import { $, fail, routeNow } from "./notices.js";
import { addUsage, costAmounts, h, millis, noTokens, priceFor } from "./session.js";

const PAGE = 50;
const EVENTS_PER_CALL = 5000; // the most ListSessionEvents returns at once
const CALLS_PER_LOAD = 10; // a filtered page may be short: fetch on, up to this many calls

const FIELDS = ["q", "agent", "state", "end", "after", "before"];

let listing = null; // { scope, request, token, shown, busy }

/** The ListSessions request of the route's parameters (the form's fields). */
function requestOf(params) {
  const request = {};
  if (params.get("q")) request.idContains = params.get("q");
  if (params.get("agent")) request.agentId = params.get("agent");
  if (params.get("state") === "live") request.live = true;
  if (params.get("state") === "stored") request.live = false;
  if (params.get("end")) request.endReason = params.get("end");
  for (const [name, field] of [["after", "createdAfter"], ["before", "createdBefore"]]) {
    const when = params.get(name) ? new Date(params.get(name)) : null;
    if (when && !Number.isNaN(when.getTime())) request[field] = when.toISOString();
  }
  return request;
}

function when(timestamp) {
  if (!timestamp) return "";
  return h("time", { datetime: timestamp }, new Date(millis(timestamp)).toLocaleString());
}

function sessionRow(session) {
  const id = session.sessionId;
  const live = Boolean(session.agentId);
  return h(
    "tr", { "data-session": id },
    h("th", { scope: "row" }, h("a", { href: `#/session/${encodeURIComponent(id)}` }, id)),
    h("td", {}, live ? h("a", { href: `#/agent/${encodeURIComponent(session.agentId)}` }, session.agentId) : "none"),
    h("td", { class: "state" }, session.loadError ? "damaged" : live ? "live" : "stored"),
    h("td", { class: "end" }, session.lastEndReason ? session.lastEndReason.replaceAll("_", " ") : "no turn ended"),
    h("td", {}, String(session.turnCount || 0)),
    h("td", {}, String(session.eventCount || 0)),
    h("td", {}, when(session.updateTime)),
    h("td", {}, when((session.header || {}).createTime)),
    h("td", { class: "cost" }, priceButton(id)),
  );
}

function priceButton(sessionId) {
  const button = h("button", { type: "button", "aria-label": `Price session ${sessionId}` }, "Price");
  button.addEventListener("click", () => priceRow(button, sessionId));
  return button;
}

/**
 * A session's cost: each assistant message's tokens times the price of the provider
 * and model that answered it (GetSession's table). ListSessions carries no tokens,
 * so it is read from the session's events, on demand, one session per click.
 */
async function sessionCost(sessionId) {
  const { prices = [] } = await agents("GetSession", { sessionId });
  if (!prices.length) return "no price table";
  const total = noTokens();
  let pageToken = "";
  do {
    const page = await agents("ListSessionEvents", { sessionId, pageSize: EVENTS_PER_CALL, pageToken });
    for (const event of page.events || []) {
      const message = event.assistantMessage;
      if (message && message.usage) addUsage(total, message.usage, priceFor(prices, message));
    }
    pageToken = page.nextPageToken || "";
  } while (pageToken);
  return costAmounts(total) || (total.unpriced ? "unpriced" : "no tokens");
}

async function priceRow(button, sessionId) {
  const mine = listing;
  const cell = button.parentElement;
  button.disabled = true;
  button.textContent = "Pricing…";
  try {
    const cost = await sessionCost(sessionId);
    cell.replaceChildren(cost);
    cell.dataset.priced = "yes";
  } catch (error) {
    button.disabled = false;
    button.textContent = "Price";
    fail(error, `Pricing session ${sessionId}`, mine ? mine.scope : routeNow());
  }
}

/** Show the sessions page for the route's parameters. */
export function openSessions(params) {
  const form = $("#sessions-form");
  for (const name of FIELDS) form.elements[name].value = params.get(name) || "";
  const size = Number(params.get("size") || 0);
  listing = { scope: routeNow(), request: { ...requestOf(params), pageSize: size > 0 ? Math.min(size, 1000) : PAGE }, token: "", shown: 0, busy: false };
  $("#sessions tbody").replaceChildren();
  $("#sessions").dataset.listed = "";
  $("#sessions-more").hidden = true;
  $("#sessions-count").textContent = "";
  loadMore();
}

/** Fetch the next page (on, while pages come back short), and append it. */
async function loadMore() {
  const mine = listing;
  if (!mine || mine.busy) return;
  mine.busy = true;
  $("#sessions-more").disabled = true;
  try {
    let found = 0;
    for (let calls = 0; calls < CALLS_PER_LOAD; calls += 1) {
      const page = await agents("ListSessions", { ...mine.request, pageToken: mine.token });
      if (listing !== mine) return; // the page left, or the filters changed
      const sessions = page.sessions || [];
      $("#sessions tbody").append(...sessions.map(sessionRow));
      found += sessions.length;
      mine.shown += sessions.length;
      mine.token = page.nextPageToken || "";
      if (!mine.token || found >= mine.request.pageSize) break;
    }
    $("#sessions-more").hidden = !mine.token;
    $("#sessions").dataset.listed = mine.token ? "" : mine.scope; // all of this route's listed
    $("#sessions-count").textContent = mine.token
      ? `(${mine.shown} so far)`
      : `(${mine.shown}${mine.shown === 1 ? " session" : " sessions"}, all)`;
    if (!mine.shown && !mine.token) {
      $("#sessions tbody").append(h("tr", {}, h("td", { colspan: 9 }, "No session matches.")));
    }
  } catch (error) {
    fail(error, "Listing the sessions", mine.scope);
  } finally {
    mine.busy = false;
    $("#sessions-more").disabled = false;
  }
}

/** Wire the filter form and the "load more" button (once). */
export function startSessionsPage() {
  $("#sessions-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const params = new URLSearchParams();
    const form = new FormData(event.target);
    for (const name of FIELDS) {
      const value = String(form.get(name) || "").trim();
      if (value) params.set(name, value);
    }
    const query = params.toString();
    const hash = `#/sessions${query ? `?${query}` : ""}`;
    if (location.hash === hash) openSessions(params); // the same filters: list again
    else location.hash = hash;
  });
  $("#sessions-more").addEventListener("click", loadMore);
}

/** Leave the sessions page: a late answer is dropped. */
export function closeSessions() {
  listing = null;
}
