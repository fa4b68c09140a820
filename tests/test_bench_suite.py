"""The bench suite names every bench in `bench/`, so that `make bench` runs them all."""

from __future__ import annotations

from pathlib import Path

from bench.suite import BENCHES

HELPERS = {
    "__init__",
    "common",
    "pinning",
    "suite",
    "echo_plugin",
    "every_seam_plugin",
    "server_probe",
}
"""Modules of `bench/` that are not benches: shared code, plugins and a probe they start."""


def test_every_bench_module_is_in_the_suite_once() -> None:
    modules = {p.stem for p in (Path(__file__).parent.parent / "bench").glob("*.py")}
    names = [bench.name for bench in BENCHES]
    assert len(names) == len(set(names))
    assert set(names) == modules - HELPERS


def test_every_bench_reports_a_target_and_has_a_quick_run() -> None:
    for bench in BENCHES:
        assert bench.target, bench.name
        assert bench.quick, bench.name
