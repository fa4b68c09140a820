// The packed client works outside the repository: `npm pack`, install the tarball into
// an empty folder, and stream a turn with a ten-line program.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { startServer } from "./server.mjs";

const here = resolve(import.meta.dirname, "..");
let server;
let work;

before(async () => {
  server = await startServer();
  work = mkdtempSync(join(tmpdir(), "agentloop-pack-"));
});

after(() => {
  server?.stop();
  rmSync(work, { recursive: true, force: true });
});

test("the packed client installs into an empty folder and streams a turn", () => {
  const tarball = execFileSync("npm", ["pack", "--silent", "--pack-destination", work], { cwd: here })
    .toString()
    .trim()
    .split("\n")
    .at(-1);
  const app = join(work, "app");
  execFileSync("mkdir", [app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", type: "module", private: true }));
  execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", "--prefer-offline", join(work, tarball)], {
    cwd: app,
  });
  writeFileSync(
    join(app, "main.mjs"),
    `import { connect } from "@agentloop/client";
const client = connect(${JSON.stringify(server.address)});
await client.create("packed");
const kinds = [];
for await (const event of await client.send("packed", "hi")) kinds.push(event.payload.case);
console.log(kinds.join(" "));`,
  );
  const out = execFileSync("node", ["main.mjs"], { cwd: app }).toString().trim();
  assert.match(out, /^turnStart .* turnEnd$/);
});
