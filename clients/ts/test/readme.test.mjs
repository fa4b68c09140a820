// The README's first TypeScript program, run as written against a real server: it
// prints the turn's tool calls with their results, then its text, as the Python ones do.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { root, startServer } from "./server.mjs";

const here = resolve(import.meta.dirname, "..");
let server;
let work;

before(async () => {
  server = await startServer();
  work = mkdtempSync(join(here, ".readme-")); // inside the package: "@agentloop/client" resolves to it
});

after(() => {
  server?.stop();
  rmSync(work, { recursive: true, force: true });
});

test("the README's TypeScript program prints the turn's tool calls and text", () => {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const clients = readme.split("\n## Clients\n")[1].split("\n## ")[0];
  const programs = [...clients.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.equal(programs.length, 1);
  const program = join(work, "main.mjs");
  writeFileSync(program, programs[0].replaceAll("127.0.0.1:50051", server.address));
  const printed = execFileSync("node", [program], { cwd: work }).toString().trim().split("\n");
  assert.deepEqual(printed, ['word_count({"text": "count these words please"}) -> 4 words', "Tool results: 4 words"]);
});
