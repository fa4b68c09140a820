// A real agentloop server for the tests: `python -m server` on a free loopback port.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";

export const root = resolve(import.meta.dirname, "../../..");

/** Start a server; resolves to { address, stop }. */
export async function startServer() {
  const python = process.env.AGENTLOOP_PYTHON ?? join(root, ".venv/bin/python");
  const dataDir = mkdtempSync(join(tmpdir(), "agentloop-ts-"));
  const server = spawn(python, ["-m", "server", "--listen", "127.0.0.1:0", "--data-dir", dataDir], {
    cwd: root,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const first = await new Promise((ok, fail) => {
    server.once("exit", (code) => fail(new Error(`the server exited (${code}) before listening`)));
    createInterface({ input: server.stdout }).once("line", ok);
  });
  const match = /agentloop listening on (\S+)/.exec(first);
  assert.ok(match, `the server printed ${first}`);
  return {
    address: match[1],
    stop() {
      server.kill("SIGTERM");
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}
