"""Plugin registrations shared by replicas (PostgreSQL).

A plugin registered through the API on one replica is recorded here (its name and the
`RegisterPluginRequest` as it came, the proto being the data model), so that every
replica connects to it; unregistering removes the record, and every replica lets the
plugin go. Config plugins are each replica's own and are not recorded.
"""

from __future__ import annotations

from agentloop.plugin.v1 import plugin_registry_service_pb2 as pb
from server.stores.postgres import PostgresStore
from server.stores.postgres_outage import outages_unavailable


@outages_unavailable(lambda shared: shared.store.health)
class SharedPlugins:
    """The `plugins` table."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.here: set[str] = set()
        """Plugins this replica connected to because they are shared (or it shared them)."""

    async def add(self, name: str, request: pb.RegisterPluginRequest) -> None:
        """Record a registration (a later one of the same name replaces it)."""
        self.here.add(name)
        pool = await self.store.pool()
        await pool.execute(
            "INSERT INTO plugins (name, request) VALUES ($1, $2)"
            " ON CONFLICT (name) DO UPDATE SET request = $2",
            name,
            request.SerializeToString(),
        )

    async def remove(self, name: str) -> None:
        """Forget a registration."""
        self.here.discard(name)
        pool = await self.store.pool()
        await pool.execute("DELETE FROM plugins WHERE name = $1", name)

    async def all(self) -> dict[str, pb.RegisterPluginRequest]:
        """Every recorded registration, by plugin name."""
        pool = await self.store.pool()
        rows = await pool.fetch("SELECT name, request FROM plugins")
        return {r["name"]: pb.RegisterPluginRequest.FromString(r["request"]) for r in rows}
