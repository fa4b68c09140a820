"""A turn's cost held to the budgets of `tests/cost_budgets.toml`, in counts, never a time.

The figures are measured in a process of their own (`python -m tests.cost --json`), so
pytest's log capture and plugins add nothing to the counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cost import ROOT, budgets


@pytest.fixture(scope="module")
def figures() -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.cost", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    measured: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return measured


def test_every_figure_has_a_budget_and_every_budget_a_figure(figures: dict[str, float]) -> None:
    assert sorted(figures) == sorted(budgets())


@pytest.mark.parametrize("name", sorted(budgets()))
@pytest.mark.timeout(300)
def test_the_figure_is_within_its_budget(figures: dict[str, float], name: str) -> None:
    budget = budgets()[name]
    value = figures[name]
    assert value <= budget.limit, (
        f"{name} is {value:,.1f} {budget.unit}, over its budget of {budget.limit:,.1f}"
        f" (set {budget.set_on} at {budget.commit}: {budget.why}). Find the cost with"
        " `python -m tests.cost` and a profile; raise the budget in tests/cost_budgets.toml"
        " only as a deliberate, explained edit."
    )


def test_the_workload_ran_as_designed(figures: dict[str, float]) -> None:
    # The budgets are ceilings; these floors make sure the workload ran (a turn that
    # silently did nothing would pass every ceiling).
    assert figures["events_per_turn"] >= 20
    assert figures["calls_per_turn"] >= 500
    assert figures["stream_messages_per_turn"] >= 1
    assert figures["stream_bytes_per_turn"] >= 20 * 20
    assert figures["grpc_server_calls_per_turn"] >= figures["calls_per_turn"]
    assert figures["startup_modules"] >= 100
