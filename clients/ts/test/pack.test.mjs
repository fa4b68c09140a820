// The packed client works outside the repository: `npm pack`, install the tarball into
// an empty folder, and stream a turn with a ten-line program. So does an install from
// the package's folder, which builds dist/ (`prepare`) where nothing built it yet.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
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

test("an install from the package's folder builds dist/ and streams a turn", () => {
  // A copy without dist/ or node_modules, as a fresh clone has it.
  const source = join(work, "ts");
  for (const name of ["package.json", "package-lock.json", "tsconfig.json", "prepare.mjs", "src"]) {
    cpSync(join(here, name), join(source, name), { recursive: true });
  }
  const app = join(work, "folder-app");
  execFileSync("mkdir", [app]);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", type: "module", private: true }));
  execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", "--prefer-offline", source], { cwd: app });
  assert.ok(existsSync(join(source, "dist", "index.js")));
  writeFileSync(
    join(app, "main.mjs"),
    `import { connect } from "@agentloop/client";
const client = connect(${JSON.stringify(server.address)});
await client.create("from-folder", { provider: "scripted", model: "echo" });
console.log((await (await client.send("from-folder", "hi")).view()).text);
client.close();`,
  );
  const out = execFileSync("node", ["main.mjs"], { cwd: app }).toString().trim();
  assert.equal(out, "You said: hi");
});
