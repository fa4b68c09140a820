// The facade's verbs, turn view and typed errors against a real server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import {
  AgentloopError,
  AlreadyExists,
  BlockKind,
  ConnectError,
  FailedPrecondition,
  InvalidArgument,
  NotFound,
  connect,
  scriptedOptions,
} from "../dist/index.js";
import { startServer } from "./server.mjs";

let server;
let client;

before(async () => {
  server = await startServer();
  client = connect(server.address, { timeout: 30 });
});

after(() => {
  client?.close();
  server?.stop();
});

const sleeps = [
  {
    text: "Sleeping twice.",
    toolCalls: [
      { id: "long", name: "sleep", arguments: '{"seconds": 0.4}' },
      { id: "short", name: "sleep", arguments: '{"seconds": 0.05}' },
    ],
    usage: { inputTokens: 10n, outputTokens: 4n },
  },
  { text: "done sleeping", chunkSize: 3, usage: { inputTokens: 20n, outputTokens: 2n } },
];

test("the view of a turn with parallel tool calls: text, calls with results, usage, end", async () => {
  await client.create("tv-1", { provider: "scripted", tools: ["sleep"], providerOptions: scriptedOptions(sleeps) });
  const turn = await client.send("tv-1", "sleep twice");
  const deltas = [];
  for await (const text of turn.textDeltas()) deltas.push(text);
  const view = await turn.view();
  assert.equal(deltas.join(""), "Sleeping twice.done sleeping");
  assert.equal(view.text, "Sleeping twice.\ndone sleeping");
  assert.equal(view.finalText, "done sleeping");
  assert.deepEqual(
    view.toolCalls.map((c) => [c.callId, c.name, c.resultText, c.isError]),
    [
      ["long", "sleep", "slept 0.4 seconds", false],
      ["short", "sleep", "slept 0.05 seconds", false],
    ],
  );
  assert.deepEqual(view.toolCalls[0].parsedArguments(), { seconds: 0.4 });
  assert.deepEqual([view.usage.inputTokens, view.usage.outputTokens], [30n, 6n]);
  assert.deepEqual([view.turn, view.steps, view.endReason, view.endDetail], [1, 2, "completed", ""]);
  assert.equal(view.end, turn.end);
});

test("session verbs read what a turn wrote; a conversation shares one stream", async () => {
  const created = await client.create("tv-2", { provider: "scripted", model: "echo", cwd: "/tmp" });
  const agent = await client.getAgent("tv-2");
  assert.equal(agent.sessionId, created.sessionId);
  const chat = client.conversation("tv-2");
  const first = await (await chat.send("hello")).result();
  const second = await chat.send("again", { requestId: "tv-2-again" });
  assert.equal((await second.view()).endReason, "completed");
  chat.close();
  const session = await client.getSession({ agentId: "tv-2" });
  assert.equal(session.sessionId, created.sessionId);
  const events = await client.listEvents({ sessionId: created.sessionId });
  assert.deepEqual(
    events.map((e) => e.seq),
    Array.from({ length: Number(second.end.seq) }, (_, i) => BigInt(i + 1)),
  );
  const tail = await client.listEvents({ agentId: "tv-2", fromSeq: first.seq });
  assert.equal(tail[0].payload.case, "turnEnd");
  const stored = [];
  for await (const event of client.stream({ sessionId: created.sessionId, replayOnly: true })) stored.push(event.seq);
  assert.deepEqual(stored, events.map((e) => e.seq));
  const injected = await client.inject("tv-2", "some context");
  assert.ok(injected.nextSeq > second.end.seq);
  const steered = await client.steer("tv-2", "when idle, an ordinary message");
  assert.equal(steered.steering, false);
  assert.equal((await client.waitIdle("tv-2", 10)).idle, true);
  assert.ok((await client.listSessions()).some((s) => s.sessionId === created.sessionId));
  assert.deepEqual(await client.plugins(), []);
});

test("listSessions takes ListSessions' filters as options", async () => {
  const before = new Date(Date.now() - 1000);
  await client.create("lf-done", { provider: "scripted", model: "echo" });
  await (await client.send("lf-done", "hello")).result();
  await client.create("lf-gone", { provider: "scripted", model: "echo" });
  await client.dispose("lf-gone");
  const agents = (sessions) => sessions.map((s) => s.sessionId.split("-session-")[0]).sort();
  assert.deepEqual(agents(await client.listSessions({ idContains: "LF-" })), ["lf-done", "lf-gone"]);
  assert.deepEqual(agents(await client.listSessions({ agentId: "lf-done" })), ["lf-done"]);
  assert.deepEqual(agents(await client.listSessions({ idContains: "lf-", live: false })), ["lf-gone"]);
  assert.deepEqual(agents(await client.listSessions({ idContains: "lf-", live: true })), ["lf-done"]);
  assert.deepEqual(agents(await client.listSessions({ idContains: "lf-", endReason: "completed" })), ["lf-done"]);
  assert.deepEqual(agents(await client.listSessions({ idContains: "lf-", endReason: "none" })), ["lf-gone"]);
  assert.deepEqual(agents(await client.listSessions({ idContains: "lf-", createdAfter: before })), ["lf-done", "lf-gone"]);
  assert.deepEqual(await client.listSessions({ idContains: "lf-", createdBefore: before }), []);
  const refused = await client.listSessions({ endReason: "finished" }).catch((e) => e);
  assert.ok(refused instanceof InvalidArgument);
  assert.equal(refused.field, "end_reason");
});

test("refusals are typed errors with their decoded details", async () => {
  const missing = await client.send("nobody", "hi").catch((error) => error);
  assert.ok(missing instanceof NotFound && missing instanceof AgentloopError && missing instanceof ConnectError);
  assert.equal(missing.reason, "AGENT_NOT_FOUND");
  assert.equal(missing.domain, "agentloop.v1");
  await client.create("tv-3", { provider: "scripted" });
  await assert.rejects(client.create("tv-3", { provider: "scripted" }), AlreadyExists);
  const bad = await client.create("tv-4", { provider: "scripted", maxParallelToolCalls: 0 }).catch((e) => e);
  assert.ok(bad instanceof InvalidArgument);
  assert.equal(bad.reason, "INVALID_FIELD");
  assert.equal(bad.field, "options.max_parallel_tool_calls");
  assert.ok(bad.fieldViolations[0].description);
  await client.dispose("tv-3");
  const disposed = await client.send("tv-3", "hi").catch((e) => e);
  assert.ok(disposed instanceof FailedPrecondition);
  assert.equal(disposed.reason, "AGENT_DISPOSED");
  const streamed = await (async () => {
    for await (const _ of client.stream({ sessionId: "no-such-session" }));
  })().catch((e) => e);
  assert.ok(streamed instanceof NotFound);
  assert.equal(streamed.reason, "SESSION_NOT_FOUND");
});

test("enums are exported from the root", () => {
  assert.equal(BlockKind.TEXT, 1);
});
