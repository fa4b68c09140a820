"""Every bench, the target each reports, and how to run them all (`make bench`).

    python -m bench.suite [--quick] [--list] [NAME ...]

Each bench runs as `python -m bench.NAME ARGS` in a process of its own, one after
another; its figures print as it prints them. `--quick` runs each with its quick
arguments instead (seconds, not minutes: CI-sized, figures too noisy to compare). A
bench whose tool is missing (valgrind) is skipped and said so. The targets are the
design notes' "Performance targets", printed beside each bench; no figure is asserted.
A bench that fails (exits non-zero) fails the suite, after the others ran.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from bench.common import ROOT


@dataclass(frozen=True)
class Bench:
    """One bench: its module (`bench.NAME`), what it reports against, how to run it."""

    name: str
    target: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    needs: str = ""
    """A program the bench runs (it is skipped without it)."""


BENCHES = (
    Bench("loop_bench", "turn ≤ 600 µs in process (memory), ≤ 800 µs (SQLite); PostgreSQL ≤ 1.5× "
          "SQLite; gRPC ≤ 2 ms per turn", (),
          ("--turns", "50", "--conversation", "60", "--idle-agents", "100",
           "--resume-events", "1000", "--long-conversation", "100")),
    Bench("turn_ab", "the turn against other checkouts in one run (--against DIR): ≤ 600 µs "
          "in process, ≤ 800 µs SQLite, ≤ 2 ms gRPC", (),
          ("--turns", "30", "--repeat", "1")),
    Bench("peers_bench", "≥ 5× ahead of the OpenAI Agents SDK and LangGraph per turn; flat over a "
          "conversation where they grow (needs `make peers`)", (),
          ("--turns", "30", "--window", "10")),
    Bench("conversation_bench", "flat over a long conversation (peers grow 5–9× over 300 turns)",
          (), ("--turns", "200", "--at", "1,200", "--window", "20", "--repeat", "1")),
    Bench("provider_request_bench", "no event-loop stall over 50 ms (a first request on a long "
          "history)", (), ("--at", "100,300")),
    Bench("resume_bench", "no event-loop stall over 50 ms (a resume of a long session)", (),
          ("--at", "100,300")),
    Bench("compaction_bench", "a resume costs the log since the last compaction; a turn that "
          "does not compact ≤ 1.02× before", (), ("--events", "3000", "--turns", "100")),
    Bench("store_pages_bench", "SQLite turn ≤ 800 µs: commits, rows and WAL pages per turn", (),
          ("--agents", "20", "--rounds", "1")),
    Bench("portable_bench", "data lifecycle: export and import time and file size of a long "
          "session", (), ("--events", "5000")),
    Bench("retention_bench", "data lifecycle: sweep rate, and turn p99 beside a sweep ÷ alone",
          (), ("--sessions", "200", "--turns", "100")),
    Bench("checkpoint_reads_bench", "no event-loop stall over 50 ms (reads during a WAL "
          "checkpoint)", (), ("--sessions", "20", "--seconds", "2")),
    Bench("load_bench", "100 agents: server CPU per turn ≤ 2× in process, p99 ≤ 5× p50, no stall "
          "over 50 ms", ("--seconds", "6"), ("--agents", "1,10", "--seconds", "2")),
    Bench("soak_bench", "memory flat under a 200-client soak, returned after disposal", (),
          ("--clients", "10", "--seconds", "5")),
    Bench("sdk_bench", "the SDK facade's turn ≈ the raw stubs' (gRPC turn ≤ 2 ms)", (),
          ("--turns", "50", "--rounds", "2")),
    Bench("http_bench", "the HTTP side against gRPC (no target: figures)", (),
          ("--calls", "50", "--turns", "5", "--rounds", "1")),
    Bench("approval_bench", "an approval round trip's cost per turn (no target: figures)", (),
          ("--turns", "10", "--rounds", "1")),
    Bench("telemetry_bench", "observability free when off; its cost when on", (),
          ("--turns", "50", "--rounds", "2")),
    Bench("plugin_bench", "one round trip per decision; filtered plugin ≤ 1.05× none; "
          "observer ≤ 1.2× CPU on a 10,000-chunk turn", (),
          ("--calls", "300", "--turns", "30", "--chunk-turns", "1")),
    Bench("conditions_bench", "a plugin on every seam whose conditions match nothing ≤ 1.05× "
          "no plugin (latency and server CPU)", (), ("--turns", "30", "--rounds", "2")),
    Bench("pingpong_bench", "the floor of a plugin call: a bidi ping-pong (≈ 150–190 µs)",
          ("default", "polled"), ("--calls", "500", "--rounds", "1", "default", "polled")),
    Bench("grpc_floor", "the floor of a gRPC call on this machine (no target: figures)", (),
          ("--calls", "500",)),
    Bench("pg_commit_bench", "PostgreSQL turn ≤ 1.5× SQLite, durable vs durable; one round trip "
          "per commit", (),
          ("--turns", "30", "--counted", "10", "--rounds", "1", "--notify-seconds", "0.5")),
    Bench("cluster_bench", "replicas: forwarding cost, failover time, throughput by count",
          ("--kills", "20"), ("--kills", "2", "--seconds", "2", "--clients", "5", "--calls", "50")),
    Bench("turn_instructions", "instructions per in-process turn against other checkouts "
          "(--against DIR): the memory-store turn ≤ 0.91× 80b4906's", (), ("--turns", "2,4"),
          "valgrind"),
    Bench("grpc_instructions", "the server's instructions per gRPC turn against other checkouts "
          "(--against DIR): ≤ 0.73× 80b4906's (issue 32)", (), ("--turns", "2,4"), "valgrind"),
    Bench("instructions_bench", "instructions per turn (a deterministic cost, for A/B)", (),
          ("--agents", "5", "--turns", "1,2"), "valgrind"),
    Bench("plugin_instructions", "instructions per plugin call and turn (for A/B)", (),
          ("--turns", "2,4", "--calls", "20,60"), "valgrind"),
    Bench("observer_instructions", "server instructions per 10,000-chunk turn with a "
          "session-event observer ≤ 1.2× without (--against DIR for A/B)", (), ("--turns", "1,2"),
          "valgrind"),
)  # fmt: skip
"""Every bench, in the order `make bench` runs them (cheapest and most-cited first)."""


def run(bench: Bench, quick: bool) -> str:
    """Run one bench; its outcome in a word or two."""
    if bench.needs and shutil.which(bench.needs) is None:
        print(f"== {bench.name}: skipped ({bench.needs} is not installed)", flush=True)
        return "skipped"
    args = bench.quick if quick else bench.full
    print(f"== {bench.name} {' '.join(args)}\n   target: {bench.target}", flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", f"bench.{bench.name}", *args], cwd=ROOT)
    seconds = time.perf_counter() - started
    return f"ok, {seconds:.0f} s" if done.returncode == 0 else f"FAILED ({done.returncode})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help="benches to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="each with its quick arguments")
    parser.add_argument("--list", action="store_true", help="list the benches and their targets")
    args = parser.parse_args()
    known = {bench.name: bench for bench in BENCHES}
    unknown = [name for name in args.names if name not in known]
    if unknown:
        parser.error(f"no bench named {', '.join(unknown)} (see --list)")
    chosen = [known[name] for name in args.names] or list(BENCHES)
    if args.list:
        for bench in chosen:
            print(f"{bench.name:<24} {bench.target}")
        return 0
    outcomes = [(bench.name, run(bench, args.quick)) for bench in chosen]
    print("== summary" + (" (quick: CI-sized runs, noisy figures)" if args.quick else ""))
    for name, outcome in outcomes:
        print(f"   {name:<24} {outcome}")
    return 1 if any(outcome.startswith("FAILED") for _, outcome in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
