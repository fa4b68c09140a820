"""Shared fixtures: a loop harness whose invariants are checked after every test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.harness import Harness
from tests.invariants import check_log, check_status_trace
from tests.postgres import postgres_instance, postgres_server  # noqa: F401 - fixtures for every test module


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    """A fresh runtime and factory; on teardown every agent is disposed and checked."""
    h = Harness()
    yield h
    await h.factory.close()
    for agent in h.created:
        check_log(agent.session.events)
    for trace in h.all_status_traces:
        check_status_trace(trace)
