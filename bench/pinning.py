"""Cores for a cluster bench: PostgreSQL on one, the replicas on the others (`taskset`).

On a machine of N usable cores, PostgreSQL (its postmaster and every backend, which
inherit the postmaster's affinity) and the load generator get the last core; the
replicas share the first N - 1, one each while there are enough, round robin beyond.
With fewer than two cores, or without `taskset`, nothing is pinned. Each core's busy
time is read from /proc/stat, each process's CPU time from /proc (`common`): what
saturates first is what bounds the throughput.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bench.common import TICKS, cpu_seconds


@dataclass(frozen=True)
class Plan:
    """Which cores run what; empty tuples when nothing is pinned."""

    replicas: tuple[int, ...]
    """The cores the replicas take in turn."""
    database: tuple[int, ...]
    """The cores of PostgreSQL and the load generator."""

    @property
    def pinned(self) -> bool:
        return bool(self.replicas)

    def replica_core(self, index: int) -> int | None:
        return self.replicas[index % len(self.replicas)] if self.replicas else None

    def command(self, index: int) -> tuple[str, ...]:
        """What replica `index` runs under: `taskset` on its core (nothing when unpinned)."""
        core = self.replica_core(index)
        return () if core is None else ("taskset", "-c", str(core))

    def describe(self, count: int) -> str:
        if not self.pinned:
            return "not pinned (--no-pin, fewer than 2 cores, or no taskset)"
        cores = sorted({self.replicas[i % len(self.replicas)] for i in range(count)})
        share = f"{count} replica(s) on core(s) {', '.join(map(str, cores))}"
        return f"{share}; PostgreSQL and the load generator on core {self.database[0]}"


UNPINNED = Plan((), ())


def plan(pin: bool = True) -> Plan:
    """The cores of this machine this process may use, split as the module says."""
    cores = sorted(os.sched_getaffinity(0))
    if not pin or len(cores) < 2 or shutil.which("taskset") is None:
        return UNPINNED
    return Plan(tuple(cores[:-1]), (cores[-1],))


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def postmaster(pgdata: Path) -> int:
    """The pid of the PostgreSQL server of `pgdata` (the first line of postmaster.pid)."""
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def pin_tree(pid: int, cores: tuple[int, ...]) -> None:
    """Pin every thread of `pid` and of its children to `cores` (later ones inherit it)."""
    if not cores:
        return
    for each in (pid, *children(pid)):
        for task in Path(f"/proc/{each}/task").glob("*"):
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.sched_setaffinity(int(task.name), cores)


def tree_seconds(pid: int) -> float:
    """CPU seconds of `pid`, its living children and those it reaped (PostgreSQL's backends)."""
    fields = (Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()
    reaped = (int(fields[13]) + int(fields[14])) / TICKS
    return cpu_seconds(pid) + reaped + sum(cpu_seconds(child) for child in children(pid))


def core_busy() -> dict[int, float]:
    """Busy seconds of each core so far (everything but idle and I/O wait), /proc/stat."""
    busy = {}
    for row in Path("/proc/stat").read_text().splitlines():
        name, *values = row.split()
        if name.startswith("cpu") and name != "cpu":
            ticks = [int(v) for v in values]
            busy[int(name[3:])] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / TICKS
    return busy
