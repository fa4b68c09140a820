/**
 * The agentloop client for Node: the generated contract (protobuf-es), Connect over
 * gRPC, and a facade with a verb per RPC whose `send()` returns the turn that answers
 * the message; `await turn.view()` gives its text, tool calls with results and usage.
 *
 *     const client = connect("127.0.0.1:50051");
 *     await client.create("demo", { provider: "scripted", tools: ["word_count"] });
 *     const view = await (await client.send("demo", "hi")).view();
 *     console.log(view.text, view.toolCalls.map((call) => call.name));
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { anyPack, type Any } from "@bufbuild/protobuf/wkt";
import { ScriptedOptionsSchema, type ScriptedStepSchema } from "./gen/agentloop/v1/scripted_pb.js";

export * from "./gen/agentloop/v1/agent_pb.js";
export * from "./gen/agentloop/v1/agent_event_pb.js";
export * from "./gen/agentloop/v1/agent_service_pb.js";
export * from "./gen/agentloop/v1/agent_factory_service_pb.js";
export * from "./gen/agentloop/v1/approval_pb.js";
export * from "./gen/agentloop/v1/content_pb.js";
export * from "./gen/agentloop/v1/decision_pb.js";
export * from "./gen/agentloop/v1/scripted_pb.js";
export * from "./gen/agentloop/v1/session_event_pb.js";
export * from "./gen/agentloop/v1/session_pb.js";
export * from "./gen/agentloop/v1/stream_pb.js";
export * from "./gen/agentloop/plugin/v1/plugin_registry_service_pb.js";
export { FailurePolicy } from "./gen/agentloop/plugin/v1/hook_service_pb.js";
export { Code, ConnectError } from "@connectrpc/connect";
export * from "./client.js";
export * from "./conversation.js";
export * from "./errors.js";
export * from "./retrying.js";
export * from "./stream.js";
export * from "./turn.js";
export * from "./view.js";

/** `AgentOptions.providerOptions` for the scripted provider: one step per model call. */
export function scriptedOptions(steps: MessageInitShape<typeof ScriptedStepSchema>[]): Any {
  return anyPack(ScriptedOptionsSchema, create(ScriptedOptionsSchema, { steps }));
}
