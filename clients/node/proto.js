'use strict';
/**
 * @file The plugin contract, loaded from the repository's `proto/` directory.
 *
 * `@grpc/proto-loader` maps messages to plain objects with these options:
 * - `keepCase: false`: camelCase fields, the JavaScript convention (`call.callId`,
 *   `call.promptSubmit`, `result.toolExecute.isError`);
 * - `enums: String`: enum values are their names (`'SEAM_PROMPT_SUBMIT'`);
 * - `longs: Number`: uint64 counters (`seq`, `dropped`) are numbers, exact below 2^53;
 * - `defaults: true`: scalars and repeated fields are always present; an unset message
 *   field is `null`;
 * - `oneofs: true`: on a received message, a oneof's name holds the member that is set
 *   (`call.payload === 'promptSubmit'`, `result.outcome`, `block.block`). To send a
 *   oneof, set exactly one of its members (`{block: {reason}}`).
 */

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/** The protos: bundled in the package by `npm pack`, else the repository's `proto/`. */
const BUNDLED = path.join(__dirname, 'proto');
const PROTO_DIR = require('node:fs').existsSync(BUNDLED) ? BUNDLED : path.join(__dirname, '..', '..', 'proto');

/** How the protos map to JavaScript objects (see the file comment). */
const LOADER_OPTIONS = {
  keepCase: false,
  enums: String,
  longs: Number,
  defaults: true,
  oneofs: true,
};

const definition = protoLoader.loadSync('agentloop/plugin/v1/hook_service.proto', {
  ...LOADER_OPTIONS,
  includeDirs: [PROTO_DIR],
});

/** The `agentloop.plugin.v1.HookService` client constructor; `.service` is its definition. */
const HookService = grpc.loadPackageDefinition(definition).agentloop.plugin.v1.HookService;

/** `snake_case` as `camelCase`. */
const camel = (name) => name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());

/**
 * The `Seam` enum's `(agentloop.plugin.v1.seam)` options, read from the protos: the one
 * seam table (proto-loader drops enum value options, so protobufjs reads them).
 * @returns {Record<string, Record<string, string>>} the options by `Seam` value name
 */
function seamOptions() {
  const protobuf = require('protobufjs');
  const root = new protobuf.Root();
  const wellKnown = path.dirname(require.resolve('protobufjs/package.json'));
  root.resolvePath = (_origin, target) =>
    path.join(target.startsWith('google/protobuf/') ? wellKnown : PROTO_DIR, target);
  root.loadSync('agentloop/plugin/v1/hook_service.proto', { keepCase: true });
  return root.lookupEnum('agentloop.plugin.v1.Seam').valuesOptions || {};
}

/**
 * The seams, from the `seam` option of each `Seam` value in the proto: the `Plugin`
 * method, the `Seam` enum value, the `HookCall` payload field (a decision goes in the
 * `HookResult` field of the same name) and whether it is answered (observers'
 * notifications are not).
 * @type {{method: string, seam: string, payload: string, answered: boolean}[]}
 */
const SEAMS = Object.entries(seamOptions())
  .filter(([, options]) => options['(seam).payload'])
  .map(([seam, options]) => ({
    method: camel(options['(seam).method']),
    seam,
    path: options['(seam).path'],
    payload: camel(options['(seam).payload']),
    answered: options['(seam).mode'] !== 'SEAM_MODE_OBSERVER',
  }));

/** The seams by `HookCall` payload field. */
const BY_PAYLOAD = new Map(SEAMS.map((spec) => [spec.payload, spec]));

/**
 * `seconds` as a `google.protobuf.Duration`.
 * @param {number} seconds
 * @returns {{seconds: number, nanos: number}}
 */
function duration(seconds) {
  const whole = Math.floor(seconds);
  return { seconds: whole, nanos: Math.round((seconds - whole) * 1e9) };
}

/**
 * A received `google.protobuf.Duration` in seconds (0 when unset).
 * @param {{seconds: number|string, nanos: number}|null|undefined} value
 */
function seconds(value) {
  return value ? Number(value.seconds) + value.nanos / 1e9 : 0;
}

module.exports = { BY_PAYLOAD, HookService, LOADER_OPTIONS, PROTO_DIR, SEAMS, duration, seconds };
