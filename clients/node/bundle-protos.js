'use strict';
// `npm pack` runs this first: the contract's .proto files go inside the package, so an
// installed helper loads them from ./proto rather than from the repository. After the
// pack (`--remove`) the copy goes: in the repository the helper reads proto/ itself.
const fs = require('node:fs');
const path = require('node:path');

const source = path.join(__dirname, '..', '..', 'proto', 'agentloop');
const target = path.join(__dirname, 'proto', 'agentloop');
fs.rmSync(path.join(__dirname, 'proto'), { recursive: true, force: true });
if (!process.argv.includes('--remove')) {
  const wanted = (p) => p.endsWith('.proto') || fs.statSync(p).isDirectory();
  fs.cpSync(source, target, { recursive: true, filter: wanted });
}
