'use strict';
// What the Node plugin helper's tests share: bounded waits, a HookService client of a
// plugin served in-process, and a Handle stream written and read as the loop does.

const { beforeEach, afterEach } = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const sdk = require('../plugin');

const T = 5000; // the longest any single wait may take, in ms

/** A promise settled from outside. */
function deferred() {
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  return { promise, resolve };
}

/** `promise`, or a rejection naming `what` once `ms` have passed. */
function within(promise, what, ms = T) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** A HookService client of the plugin at `address` (host:port). */
function connect(address) {
  return new sdk.HookService(address, grpc.credentials.createInsecure());
}

/** Serve `plugin` on a free loopback port; returns a HookService client of it. */
async function serve(plugin) {
  return connect(`127.0.0.1:${await plugin.serve('127.0.0.1:0')}`);
}

/**
 * Before each test: `make()` builds `{ plugin, probe }` and the plugin is served; after
 * each: the client is closed and the plugin stopped. Returns the object that holds the
 * current test's `plugin`, `probe` and `client`.
 */
function servedForEachTest(make) {
  const served = {};
  beforeEach(async () => {
    Object.assign(served, make());
    served.client = await serve(served.plugin);
  });
  afterEach(async () => {
    served.client.close();
    await served.plugin.stop({ grace: 0 });
  });
  return served;
}

/** Describe, bounded by T. */
function describe(client, metadata = new grpc.Metadata()) {
  return new Promise((resolve, reject) =>
    client.Describe({}, metadata, { deadline: Date.now() + T }, (error, response) =>
      error ? reject(error) : resolve(response)));
}

/** One Handle stream, written and read as the loop does; every read is bounded. */
class HandleStream {
  constructor(client, metadata = new grpc.Metadata()) {
    this.call = client.Handle(metadata);
    this.responses = [];
    this.waiters = [];
    this.ended = deferred();
    this.call.on('data', (response) => {
      const waiter = this.waiters.shift();
      if (waiter) waiter.resolve(response); else this.responses.push(response);
    });
    this.call.on('status', (status) => this.ended.resolve(status));
    this.call.on('error', (error) => {
      for (const waiter of this.waiters.splice(0)) waiter.reject(error);
      this.error = error;
    });
  }

  send(...calls) { for (const call of calls) this.call.write({ call }); }

  cancel(callId) { this.call.write({ cancel: { callId, reason: 'x' } }); }

  /** The next response (a result or a model chunk). */
  response() {
    if (this.responses.length) return Promise.resolve(this.responses.shift());
    if (this.error) return Promise.reject(this.error);
    const next = new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
    return within(next, 'a response');
  }

  /** The result the next response carries. */
  async result() {
    return (await this.response()).result;
  }

  /** The results of the next `count` responses. */
  async take(count) {
    const all = [];
    for (let i = 0; i < count; i += 1) all.push(await this.result());
    return all;
  }

  /** One model call's chunks up to its finish (the only call in flight). */
  async chunks(callId) {
    const chunks = [];
    for (;;) {
      const response = await this.response();
      assert.equal(response.kind, 'chunk', JSON.stringify(response));
      assert.equal(response.chunk.callId, callId);
      chunks.push(response.chunk.chunk);
      if (response.chunk.chunk.finish) return chunks;
    }
  }

  /** Close the loop's side; what the plugin still sends before ending the stream. */
  async finish() {
    this.call.end();
    const status = await within(this.ended.promise, 'the end of the stream');
    assert.equal(status.code, grpc.status.OK);
    return this.responses.splice(0);
  }
}

module.exports = {
  T, deferred, within, connect, serve, servedForEachTest, describe, HandleStream,
};
