// The TypeScript client against a real server: `python -m server` on a free port.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect, scriptedOptions } from "../dist/index.js";
import { startServer } from "./server.mjs";

let server;
let client;

before(async () => {
  server = await startServer();
  client = connect(server.address);
});

after(() => server?.stop());

function scripted(steps, tools = []) {
  return { provider: "scripted", model: "m", tools, providerOptions: scriptedOptions(steps) };
}

test("a created agent streams the turn that answers a message, to its end", async () => {
  const agent = await client.create("ts-1", scripted([{ text: "hello from the script" }]));
  assert.equal(agent.agentId, "ts-1");
  const turn = await client.send("ts-1", "hi", { requestId: "ts-request-1" });
  const events = [];
  for await (const event of turn) events.push(event);
  assert.equal(events[0].payload.case, "turnStart");
  assert.equal(events.at(-1).payload.case, "turnEnd");
  assert.equal(events.at(-1).payload.value.reason.kind.case, "completed");
  const mine = events.filter((e) => e.payload.case === "userMessage").map((e) => e.payload.value.requestId);
  assert.deepEqual(mine, ["ts-request-1"]);
  const answer = events.find((e) => e.payload.case === "assistantMessage").payload.value;
  assert.equal(answer.content[0].block.value.text, "hello from the script");
  // Sequence numbers are contiguous from where the turn started.
  events.forEach((e, i) => assert.equal(e.seq, events[0].seq + BigInt(i)));
});

test("cancel ends the running turn aborted", async () => {
  const nap = { name: "sleep", arguments: '{"seconds": 60}' };
  await client.create("ts-2", scripted([{ toolCalls: [nap] }], ["sleep"]));
  const turn = await client.send("ts-2", "sleep a minute");
  const kinds = [];
  for await (const event of turn) {
    kinds.push(event.payload.case);
    if (event.payload.case === "toolCall") {
      const cancelled = await client.cancel("ts-2", "enough");
      assert.equal(cancelled.cancelled, true);
    }
  }
  assert.equal(turn.end.payload.value.reason.kind.case, "aborted");
  assert.equal(turn.end.payload.value.reason.kind.value.reason, "enough");
  assert.ok(kinds.includes("toolResult"));
  const idle = await client.waitIdle("ts-2", 5);
  assert.equal(idle.idle, true);
});

test("a tool call waiting for approval is listed and resolved", async () => {
  const count = { id: "w1", name: "word_count", arguments: '{"text": "a b"}' };
  const options = { ...scripted([{ toolCalls: [count] }, { text: "ok" }], ["word_count"]), approvalRequiredTools: ["word_count"] };
  await client.create("ts-approve", options);
  const turn = await client.send("ts-approve", "count");
  const results = [];
  for await (const event of turn) {
    if (event.payload.case === "approvalRequested") {
      const [pending] = await client.approvals("ts-approve");
      assert.equal(pending.approvalId, event.payload.value.approvalId);
      const resolution = await client.resolveApproval("ts-approve", pending.approvalId, { allow: true });
      assert.equal(resolution.resolvedBy, "api");
    }
    if (event.payload.case === "toolResult") results.push(event.payload.value);
  }
  assert.equal(results[0].content[0].block.value.text, "2 words");
  assert.deepEqual(await client.approvals("ts-approve"), []);
});
