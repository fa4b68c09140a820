// The console's router: #/ (the agents), #/agent/<id> and #/session/<id>?seq=N (the
// session page), #/sessions?... (the sessions, filtered), #/plugins; and the token
// form. Each page is its own module.
import { getToken, setToken } from "./api.js";
import { followAgents, refreshAgents, startAgents } from "./agents_page.js";
import { $, clearNotice, enterRoute, notify } from "./notices.js";
import { refreshPlugins } from "./plugins_page.js";
import { closeSession, openSession, startSessionPage } from "./session_page.js";
import { closeSessions, openSessions, startSessionsPage } from "./sessions_page.js";
import { startTheme } from "./theme.js";

/** A route's parts decoded; null when one is not valid %-encoding (`%E0%A4%A`). */
function decodeParts(path) {
  try {
    return path.split("/").filter(Boolean).map(decodeURIComponent);
  } catch {
    return null;
  }
}

function route() {
  const hash = location.hash || "#/";
  const [path, query] = hash.slice(1).split("?");
  const params = new URLSearchParams(query || "");
  const decoded = decodeParts(path);
  const parts = decoded || [];
  enterRoute(hash);
  closeSession();
  closeSessions();
  $("#home-view").hidden = true;
  $("#sessions-view").hidden = true;
  $("#session-view").hidden = true;
  $("#plugins-view").hidden = true;
  if (parts[0] === "agent" || parts[0] === "session") {
    openSession(parts, params);
  } else if (parts[0] === "sessions") {
    $("#sessions-view").hidden = false;
    openSessions(params);
  } else if (parts[0] === "plugins") {
    $("#plugins-view").hidden = false;
    refreshPlugins();
  } else {
    $("#home-view").hidden = false;
    if (decoded === null) notify(`The address ${hash.slice(0, 200)} is not a page of the console; showing the agents.`);
  }
  document.querySelectorAll("#agents a[aria-current]").forEach((a) => a.removeAttribute("aria-current"));
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setToken($("#token").value);
  clearNotice();
  refreshAgents();
  followAgents();
  route();
});

$("#token").value = getToken();
startTheme();
window.addEventListener("hashchange", route);
startSessionPage();
startSessionsPage();
startAgents();
route();
