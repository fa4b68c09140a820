'use strict';
// The helper as a user gets it: TLS on the plugin's port, and `npm pack` installed into
// an empty folder (protos and types inside), serving a plugin outside the repository.
const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const sdk = require('../plugin');

function describe(client) {
  return new Promise((resolve, reject) => {
    client.Describe({}, { deadline: Date.now() + 5000 }, (error, reply) => (error ? reject(error) : resolve(reply)));
  });
}

test('a plugin serves over TLS, and a plaintext client is refused', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'plugin-tls-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const cert = path.join(dir, 'cert.pem');
  const key = path.join(dir, 'key.pem');
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
    '-nodes', '-subj', '/CN=localhost', '-addext', 'subjectAltName=IP:127.0.0.1,DNS:localhost',
    '-days', '1', '-keyout', key, '-out', cert], { stdio: 'ignore' });
  const plugin = sdk.createPlugin({ name: 'tls-node', version: '1' });
  const port = await plugin.serve('127.0.0.1:0', { tls: { cert: fs.readFileSync(cert), key: fs.readFileSync(key) } });
  t.after(() => plugin.stop({ grace: 0 }));
  const secure = new sdk.HookService(`127.0.0.1:${port}`, grpc.credentials.createSsl(fs.readFileSync(cert)));
  assert.equal((await describe(secure)).name, 'tls-node');
  secure.close();
  const plain = new sdk.HookService(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
  await assert.rejects(describe(plain));
  plain.close();
});

test('the packed helper installs into an empty folder and serves a plugin', (t) => {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'plugin-pack-'));
  t.after(() => fs.rmSync(work, { recursive: true, force: true }));
  const here = path.join(__dirname, '..');
  const out = execFileSync('npm', ['pack', '--silent', '--pack-destination', work], { cwd: here }).toString();
  const tarball = out.trim().split('\n').at(-1);
  const app = path.join(work, 'app');
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', private: true }));
  execFileSync('npm', ['install', '--silent', '--no-audit', '--no-fund', '--prefer-offline', path.join(work, tarball)], { cwd: app });
  const installed = path.join(app, 'node_modules', '@agentloop', 'plugin');
  assert.ok(fs.existsSync(path.join(installed, 'types', 'plugin.d.ts')), 'types are packed');
  assert.ok(fs.existsSync(path.join(installed, 'proto', 'agentloop', 'plugin', 'v1', 'hook_service.proto')));
  fs.writeFileSync(path.join(app, 'main.js'), `
const grpc = require('@grpc/grpc-js');
const { createPlugin, HookService, PROTO_DIR } = require('@agentloop/plugin');
const plugin = createPlugin({ name: 'packed', version: '1' });
plugin.serve('127.0.0.1:0').then((port) => {
  new HookService('127.0.0.1:' + port, grpc.credentials.createInsecure()).Describe({}, (error, reply) => {
    console.log(error ? error.message : reply.name, PROTO_DIR.startsWith(__dirname));
    plugin.stop({ grace: 0 });
  });
});`);
  const printed = execFileSync('node', ['main.js'], { cwd: app }).toString().trim();
  assert.equal(printed, 'packed true');
});
