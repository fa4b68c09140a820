/**
 * One error family for every refused or failed call, with the server's details.
 *
 * The server puts a `google.rpc.Status` in the trailer of every refusal: an `ErrorInfo`
 * (a stable `reason` such as `AGENT_NOT_FOUND`, domain `agentloop.v1`, metadata) and,
 * when one field is at fault, a `BadRequest` naming it. The facade's verbs throw an
 * `AgentloopError` (a `ConnectError`) with those details decoded:
 *
 *     try { await client.send("nobody", "hi"); }
 *     catch (error) { if (error instanceof NotFound) console.log(error.reason); }
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";

/** One bad field of a request: its path (`options.tools[0]`) and what is wrong. */
export interface FieldViolation {
  field: string;
  description: string;
}

/** A call the server refused or that failed, with its decoded details. */
export class AgentloopError extends ConnectError {
  /** `ErrorInfo.reason`: a stable, machine-readable name ("" when none was sent). */
  reason = "";
  /** `ErrorInfo.domain`: who names the reason (`agentloop.v1`). */
  domain = "";
  /** `ErrorInfo.metadata`: facts about the refusal (an agent id, a limit...). */
  info: Record<string, string> = {};
  /** `BadRequest.field_violations`: the fields at fault, if any. */
  fieldViolations: FieldViolation[] = [];
  /** `RetryInfo.retry_delay` in seconds, when the server says when to retry. */
  retryDelay?: number;

  /**
   * By the prototype chain: `ConnectError`'s own check (by shape, across realms) would
   * call every `ConnectError` a `NotFound`.
   */
  static [Symbol.hasInstance](value: unknown): boolean {
    return Function.prototype[Symbol.hasInstance].call(this, value);
  }

  /** The first bad field's path ("" when no field was named). */
  get field(): string {
    return this.fieldViolations[0]?.field ?? "";
  }

  /** The typed error of a failed call (anything else is returned as it is). */
  static of(error: unknown): unknown {
    if (error instanceof AgentloopError || !(error instanceof ConnectError)) return error;
    const Kind = BY_CODE.get(error.code) ?? AgentloopError;
    const typed = new Kind(error.rawMessage, error.code, error.metadata, undefined, error);
    for (const detail of error.details) {
      if (!("type" in detail) || !(detail.value instanceof Uint8Array)) continue;
      const reader = new BinaryReader(detail.value);
      if (detail.type === "google.rpc.ErrorInfo") typed.readErrorInfo(reader);
      else if (detail.type === "google.rpc.BadRequest") typed.readBadRequest(reader);
      else if (detail.type === "google.rpc.RetryInfo") typed.readRetryInfo(reader);
    }
    return typed;
  }

  private readErrorInfo(reader: BinaryReader): void {
    for (const [field, value] of fieldsOf(reader)) {
      if (field === 1) this.reason = value.string();
      else if (field === 2) this.domain = value.string();
      else if (field === 3) {
        let key = "";
        let text = "";
        for (const [entryField, entry] of fieldsOf(new BinaryReader(value.bytes()))) {
          if (entryField === 1) key = entry.string();
          else if (entryField === 2) text = entry.string();
        }
        this.info[key] = text;
      }
    }
  }

  private readBadRequest(reader: BinaryReader): void {
    for (const [field, value] of fieldsOf(reader)) {
      if (field !== 1) continue;
      const violation: FieldViolation = { field: "", description: "" };
      for (const [inner, part] of fieldsOf(new BinaryReader(value.bytes()))) {
        if (inner === 1) violation.field = part.string();
        else if (inner === 2) violation.description = part.string();
      }
      this.fieldViolations.push(violation);
    }
  }

  private readRetryInfo(reader: BinaryReader): void {
    for (const [field, value] of fieldsOf(reader)) {
      if (field !== 1) continue;
      let seconds = 0;
      let nanos = 0;
      for (const [inner, part] of fieldsOf(new BinaryReader(value.bytes()))) {
        if (inner === 1) seconds = Number(part.int64());
        else if (inner === 2) nanos = part.int32();
      }
      this.retryDelay = seconds + nanos / 1e9;
    }
  }
}

/**
 * The fields of a message, each with a reader positioned at its value; a field this
 * decoder does not read is skipped whatever its wire type.
 */
function* fieldsOf(reader: BinaryReader): Generator<[number, BinaryReader]> {
  while (reader.pos < reader.len) {
    const [field, wireType] = reader.tag();
    const start = reader.pos;
    yield [field, reader];
    if (reader.pos === start) reader.skip(wireType as WireType, field);
  }
}

/** INVALID_ARGUMENT: a field of the request is wrong (see `fieldViolations`). */
export class InvalidArgument extends AgentloopError {}
/** NOT_FOUND: no such agent, session, approval or plugin. */
export class NotFound extends AgentloopError {}
/** ALREADY_EXISTS: the agent, session or plugin exists already. */
export class AlreadyExists extends AgentloopError {}
/** FAILED_PRECONDITION: not now (a disposed agent, an approval already answered). */
export class FailedPrecondition extends AgentloopError {}
/** RESOURCE_EXHAUSTED: a limit was reached (the message names it). */
export class ResourceExhausted extends AgentloopError {}
/** UNAUTHENTICATED: no token, or a wrong one. */
export class Unauthenticated extends AgentloopError {}
/** UNAVAILABLE: the server cannot answer now (down, stopping, an agent moving); retry. */
export class Unavailable extends AgentloopError {}

const BY_CODE = new Map<Code, typeof AgentloopError>([
  [Code.InvalidArgument, InvalidArgument],
  [Code.NotFound, NotFound],
  [Code.AlreadyExists, AlreadyExists],
  [Code.FailedPrecondition, FailedPrecondition],
  [Code.ResourceExhausted, ResourceExhausted],
  [Code.Unauthenticated, Unauthenticated],
  [Code.Unavailable, Unavailable],
]);

/** The answer of a call; its failure as a typed `AgentloopError`. */
export async function call<T>(pending: Promise<T>): Promise<T> {
  try {
    return await pending;
  } catch (error) {
    throw AgentloopError.of(error);
  }
}
