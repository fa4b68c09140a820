// The TypeScript client over real replicas: `python -m server.cluster.devcluster` (an
// embedded PostgreSQL and two `python -m server` replicas). While replica r0 is
// drained (`drain()`), sends for its agents through r1 meet `UNAVAILABLE`
// `AGENT_MOVING` and are retried by the client with the same request id, and a
// stream by agent id that ends `AGENT_MOVING` resumes from its last seq: every send
// resolves, each request id is in the log once, and the stream sees the log whole.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { connect, scriptedOptions } from "../dist/index.js";
import { root } from "./server.mjs";

let cluster;
let dataDir;
const addresses = [];

before(async () => {
  const python = process.env.AGENTLOOP_PYTHON ?? join(root, ".venv/bin/python");
  dataDir = mkdtempSync(join(tmpdir(), "agentloop-ts-cluster-"));
  const args = ["-m", "server.cluster.devcluster", "--replicas", "2", "--port", "0", "--lease-seconds", "1", "--data-dir", dataDir];
  cluster = spawn(python, args, { cwd: root, stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((ok, fail) => {
    cluster.once("exit", (code) => fail(new Error(`the cluster exited (${code}) before it was ready`)));
    createInterface({ input: cluster.stdout }).on("line", (line) => {
      const match = /^replica r\d: agentloop listening on (\S+)/.exec(line);
      if (match) addresses.push(match[1]);
      if (line.startsWith("cluster ready")) ok();
    });
  });
});

after(async () => {
  if (cluster && cluster.exitCode === null) {
    const exited = new Promise((ok) => cluster.once("exit", ok));
    cluster.kill("SIGTERM");
    await exited;
  }
  rmSync(dataDir, { recursive: true, force: true });
});

function sleeper() {
  const nap = { name: "sleep", arguments: '{"seconds": 0.3}' };
  const steps = [];
  for (let i = 0; i < 20; i++) steps.push({ toolCalls: [nap] }, { text: `slept ${i}` });
  return { provider: "scripted", model: "m", tools: ["sleep"], providerOptions: scriptedOptions(steps) };
}

test("a drain moves agents under load: sends are retried with their ids, streams resume", async () => {
  const [r0, r1] = addresses.map((address) => connect(address, { timeout: 30 }));
  const agents = ["tsd-0", "tsd-1"];
  for (const agentId of agents) await r0.create(agentId, sleeper());
  // r1's fair share, idle: with two agents each no rebalancing moves r0's before the drain.
  for (const agentId of ["tsd-r1-0", "tsd-r1-1"]) await r1.create(agentId, sleeper());
  const stream = r1.stream({ agentId: "tsd-0" }); // forwarded to r0, its owner
  const seen = [];
  const reading = (async () => {
    for await (const event of stream) seen.push(event);
  })();
  const sent = [];
  let sending = true;
  const load = (async () => {
    for (let n = 0; sending; n++) {
      const requestId = `tsd-${n}`;
      await r1.agents.sendMessage({ agentId: agents[n % 2], text: "go", requestId }, { timeoutMs: 30000 });
      sent.push(requestId); // resolved: refusals were retried inside the call
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  })();
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const drained = await r0.drain();
  assert.equal(drained.replicaId, "r0");
  assert.deepEqual([...drained.agentIds].sort(), agents);
  await new Promise((resolve) => setTimeout(resolve, 1500)); // sends go on, now to r1
  sending = false;
  await load;
  for (const agentId of agents) assert.equal((await r1.waitIdle(agentId, 20)).idle, true);
  const stored = [];
  for (const agentId of agents) stored.push(...(await r1.listEvents({ agentId })));
  const ids = stored.filter((e) => e.payload.case === "userMessage").map((e) => e.payload.value.requestId);
  assert.deepEqual([...ids].sort(), [...sent].sort()); // every accepted send once
  const log = await r1.listEvents({ agentId: "tsd-0" });
  for (let i = 0; i < 100 && seen.length < log.length; i++) await new Promise((resolve) => setTimeout(resolve, 100));
  stream.close();
  await reading.catch(() => undefined);
  assert.ok(stream.reconnects > 0, "the stream was moved and resumed");
  assert.deepEqual(seen.map((e) => e.seq), log.map((e) => e.seq)); // nothing lost or repeated
  r0.close();
  r1.close();
});
