// The TypeScript facade has the Python facade's surface, by name (camelCase here): the
// client's verbs, the turn's methods, the turn view's and tool call view's members.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { AgentloopClient, ToolCallView, Turn, TurnView } from "../dist/index.js";
import { root } from "./server.mjs";

const PYTHON_SURFACE = `
import dataclasses, inspect, json
from agentloop import Client, ToolCallView, Turn, TurnView
from agentloop.surface import VERBS

def methods(cls):
    return [n for n, m in inspect.getmembers(cls) if not n.startswith("_") and inspect.isfunction(m)]

def properties(cls):
    return [n for n, m in inspect.getmembers(cls) if not n.startswith("_") and isinstance(m, property)]

print(json.dumps({
    "verbs": sorted(set(VERBS.values())),
    "client": methods(Client),
    "turn": methods(Turn),
    "turnView": [f.name for f in dataclasses.fields(TurnView)],
    "toolCallView": [f.name for f in dataclasses.fields(ToolCallView)] + properties(ToolCallView) + methods(ToolCallView),
}))
`;

const camel = (name) => name.replace(/_([a-z])/g, (_, letter) => letter.toUpperCase());
const sorted = (names) => [...new Set(names)].sort();
const methodsOf = (cls) => Object.getOwnPropertyNames(cls.prototype).filter((n) => n !== "constructor");

const python = process.env.AGENTLOOP_PYTHON ?? join(root, ".venv/bin/python");
const surface = JSON.parse(execFileSync(python, ["-c", PYTHON_SURFACE], { cwd: root }).toString());
const expect = (names) => sorted(names.map(camel));

test("the client has the Python client's verbs, one per RPC", () => {
  assert.deepEqual(sorted(methodsOf(AgentloopClient)), expect(surface.client));
  for (const verb of surface.verbs) assert.ok(methodsOf(AgentloopClient).includes(camel(verb)), verb);
});

test("a turn has the Python turn's methods", () => {
  assert.deepEqual(sorted(methodsOf(Turn)), expect(surface.turn));
});

test("the turn view and the tool call view have the Python views' members", () => {
  assert.deepEqual(sorted(Object.keys(new TurnView())), expect(surface.turnView));
  const call = new ToolCallView("id", "name", "{}", 1);
  assert.deepEqual(sorted([...Object.keys(call), ...methodsOf(ToolCallView)]), expect(surface.toolCallView));
});
