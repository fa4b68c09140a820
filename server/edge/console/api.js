// The JSON API of the HTTP side: POST /api/<Service>/<Method>, and server-sent events
// read with fetch() (EventSource cannot send the Authorization header).

let token = sessionStorage.getItem("agentloop.token") || "";

export function setToken(value) {
  token = value.trim();
  sessionStorage.setItem("agentloop.token", token);
}

export function getToken() {
  return token;
}

/** A refusal of the server: the gRPC status (code name, message, details). */
export class ApiError extends Error {
  constructor(status, httpStatus) {
    super(status.message || status.status || `HTTP ${httpStatus}`);
    this.status = status.status || "UNKNOWN";
    this.code = status.code || 0;
    this.details = status.details || [];
    this.httpStatus = httpStatus;
  }

  /** The ErrorInfo reason, if any. */
  get reason() {
    const info = this.details.find((d) => (d["@type"] || "").endsWith("google.rpc.ErrorInfo"));
    return info ? info.reason : "";
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

async function refusal(response) {
  let body;
  try {
    body = await response.json();
  } catch {
    body = { status: "UNKNOWN", message: `HTTP ${response.status} ${response.statusText}` };
  }
  return new ApiError(body, response.status);
}

/** Call a unary method; resolves to the response as JSON, rejects with ApiError. */
export async function call(service, method, body = {}) {
  const response = await fetch(`/api/${service}/${method}`, {
    method: "POST",
    headers: headers(),
    body: JSON.stringify(body),
  });
  if (!response.ok) throw await refusal(response);
  return response.json();
}

export const factory = (method, body) => call("agentloop.v1.AgentFactoryService", method, body);
export const agents = (method, body) => call("agentloop.v1.AgentService", method, body);
/** Every agent's live events and turn ends, server-wide (StreamAgentEvents). */
export const agentFeed = (onMessage, signal) =>
  stream({}, onMessage, signal, "agentloop.v1.AgentFactoryService/StreamAgentEvents");

export const registry = (method, body) =>
  call("agentloop.plugin.v1.PluginRegistryService", method, body);

/**
 * Stream session events: `onMessage(response)` per StreamSessionEventsResponse (or per
 * response of the streaming method `path`). Resolves when the stream ends; rejects with
 * ApiError (refused, or an `error` event).
 */
export async function stream(request, onMessage, signal, path = "agentloop.v1.AgentService/StreamSessionEvents") {
  const response = await fetch(`/api/${path}`, {
    method: "POST",
    headers: { ...headers(), Accept: "text/event-stream" },
    body: JSON.stringify(request),
    signal,
  });
  if (!response.ok) throw await refusal(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let kind = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) kind = line.slice(7);
        else if (line.startsWith("data: ")) data.push(line.slice(6));
      }
      if (!data.length) continue;
      const payload = JSON.parse(data.join("\n"));
      if (kind === "error") throw new ApiError(payload, 200);
      if (kind === "end") return;
      onMessage(payload);
    }
  }
}
