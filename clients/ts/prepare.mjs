// `prepare`: build dist/ when the package is installed from a folder or a git checkout
// (`npm install ./clients/ts`), where nothing built it yet. Such an install does not
// install the package's dev dependencies, so the TypeScript compiler is fetched first.
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";

const here = import.meta.dirname;
const run = (command, args) => execFileSync(command, args, { cwd: here, stdio: "inherit" });
if (!existsSync(`${here}/node_modules/.bin/tsc`)) {
  run("npm", ["install", "--include=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--no-save"]);
}
run(`${here}/node_modules/.bin/tsc`, ["-p", "tsconfig.json"]);
