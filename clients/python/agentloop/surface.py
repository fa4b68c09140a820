"""Which facade verb makes each RPC of the public services.

The Python clients (`Client`, `SyncClient`) and the TypeScript one (`AgentloopClient`,
the verbs in camelCase) all have these verbs; tests hold every RPC of the contract to
this table and every client to its verbs.
"""

from __future__ import annotations

VERBS: dict[str, str] = {
    "agentloop.v1.AgentFactoryService.CreateAgent": "create",
    "agentloop.v1.AgentFactoryService.ResumeAgent": "resume",
    "agentloop.v1.AgentFactoryService.DisposeAgent": "dispose",
    "agentloop.v1.AgentFactoryService.GetAgent": "get_agent",
    "agentloop.v1.AgentFactoryService.ListAgents": "list_agents",
    "agentloop.v1.AgentFactoryService.DrainReplica": "drain",
    "agentloop.v1.AgentFactoryService.StreamAgentEvents": "stream_agent_events",
    "agentloop.v1.AgentService.SendMessage": "send",
    "agentloop.v1.AgentService.SteerMessage": "steer",
    "agentloop.v1.AgentService.InjectContext": "inject",
    "agentloop.v1.AgentService.CancelTurn": "cancel",
    "agentloop.v1.AgentService.WaitIdle": "wait_idle",
    "agentloop.v1.AgentService.GetSession": "get_session",
    "agentloop.v1.AgentService.ListSessions": "list_sessions",
    "agentloop.v1.AgentService.ForkSession": "fork",
    "agentloop.v1.AgentService.DeleteSession": "delete_session",
    "agentloop.v1.AgentService.CompactAgent": "compact",
    "agentloop.v1.AgentService.ListSessionEvents": "list_events",
    "agentloop.v1.AgentService.StreamSessionEvents": "stream",
    "agentloop.v1.AgentService.ResolveApproval": "resolve_approval",
    "agentloop.v1.AgentService.ListApprovals": "approvals",
    "agentloop.plugin.v1.PluginRegistryService.RegisterPlugin": "register_plugin",
    "agentloop.plugin.v1.PluginRegistryService.UnregisterPlugin": "unregister_plugin",
    "agentloop.plugin.v1.PluginRegistryService.ListPlugins": "plugins",
    "agentloop.plugin.v1.PluginRegistryService.ListToolSources": "tool_sources",
}
"""RPC full name (`package.Service.Method`) to the verb that calls it."""

SERVICES = (
    "agentloop.v1.AgentFactoryService",
    "agentloop.v1.AgentService",
    "agentloop.plugin.v1.PluginRegistryService",
)
"""The services a client calls (`HookService` is served by plugins, not called)."""
