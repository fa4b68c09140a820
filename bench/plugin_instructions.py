"""A plugin's cost counted in instructions (valgrind): figures the machine's load leaves alone.

    python -m bench.plugin_instructions [--baseline DIR] [--turns 5,25] [--calls 200,1200]

On a shared machine the CPU time of a plugin call moves with the other processes; the
instructions it executes hardly do. Each figure runs one side under
`valgrind --tool=cachegrind --cache-sim=no` (the other side natively) twice, for a few
and for more turns (or calls), and divides the difference of the two counts by the
difference of turns: start-up and warm-up cancel out. Counted: the user-space
instructions of all of the counted process's threads (gRPC's included), not the
kernel's. The figures:
- the plugin process (the bench's SDK plugin on every seam) per turn of the bench's
  workload, and the server (this process, its plugin client and the loop) per turn;
- the plugin process per remote seam call (the server's plugin client sending
  `turn_stop` calls one after another), for the SDK plugin and for a bare grpc.aio
  echo server (`bench/echo_plugin.py`): the floor;
- the calling side per call to the SDK plugin: the server's plugin client, and a bare
  grpc.aio client writing a call and reading its answer in one task (the floor: it
  shares the stream with no other caller, so needs no reader task).
The split of two runs depends a little on timing (notifications ride on a call or go
alone), so a figure moves by a few percent between runs. Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from bench.common import checkout_env, instructions

CACHEGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no"]
HERE = Path(__file__).resolve()
FIGURES = (
    ("plugin per turn", "plugin-turns", "every_seam_plugin.py"),
    ("server per turn", "server-turns", "every_seam_plugin.py"),
    ("SDK plugin per seam call", "plugin-calls", "every_seam_plugin.py"),
    ("echo plugin per seam call", "plugin-calls", "echo_plugin.py"),
    ("server's client per seam call", "client-calls", "every_seam_plugin.py"),
    ("bare client per seam call", "bare-calls", "every_seam_plugin.py"),
)
CALLS = ("plugin-calls", "client-calls", "bare-calls")
"""The roles that count per call, not per turn."""
COUNTED_HERE = ("server-turns", "client-calls", "bare-calls")
"""The roles that count this process (the calling side), not the plugin's."""


async def child(role: str, script: str, count: int, out: str) -> None:
    """One run, in the process whose tree is on PYTHONPATH: `count` turns or calls."""
    from bench import plugin_bench as pb

    command = [sys.executable, str(pb.HERE / script)]
    if role not in COUNTED_HERE:  # the plugin is counted
        command = [*CACHEGRIND, f"--cachegrind-out-file={out}", *command]
    plugin = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert plugin.stdout is not None
    line = (await asyncio.wait_for(plugin.stdout.readline(), 300)).decode()
    address = line.rsplit(" ", 1)[-1].strip()
    if role == "bare-calls":
        await pb.ping_pong(address, count)
    elif role in CALLS:
        await pb.seam_calls(address, count)
    else:
        await pb.turns(address, count)
    plugin.terminate()
    await asyncio.wait_for(plugin.wait(), 300)


async def count(tree: str, role: str, script: str, n: int) -> int:
    """The instructions of one run of `role` with `n` turns or calls, in `tree`."""
    env = checkout_env(tree)
    env.pop("GRPC_EXPERIMENTS", None)
    with tempfile.TemporaryDirectory(prefix="agentloop-cachegrind-") as directory:
        out = f"{directory}/cachegrind.out"
        command = [sys.executable, str(HERE), "--child", role, script, str(n), out]
        if role in COUNTED_HERE:  # this side is counted
            command = [*CACHEGRIND, f"--cachegrind-out-file={out}", *command]
        process = await asyncio.create_subprocess_exec(
            *command, cwd=tree, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, errors = await process.communicate()
        try:
            return instructions(out)
        except FileNotFoundError:  # the run failed: say why
            raise SystemExit(f"{role} {script} {n}: no count\n{errors.decode()[-3000:]}") from None


async def figures(tree: str, turns: tuple[int, int], calls: tuple[int, int]) -> list[float]:
    """Each figure of `FIGURES` for `tree`: instructions per turn or per call."""
    values = []
    for _, role, script in FIGURES:
        few, more = calls if role in CALLS else turns
        low, high = await asyncio.gather(
            count(tree, role, script, few), count(tree, role, script, more)
        )
        values.append((high - low) / (more - few))
    return values


async def main(baseline: str | None, turns: tuple[int, int], calls: tuple[int, int]) -> None:
    trees = {"this": str(HERE.parent.parent)}
    if baseline:
        trees = {"baseline": baseline, **trees}
    results = {name: await figures(tree, turns, calls) for name, tree in trees.items()}
    print(f"plugin instructions (valgrind) · turns {turns} · calls {calls}")
    header = "".join(f"{name:>14}" for name in results)
    print(f"  {'figure':<28}{header}{'this/base' if baseline else '':>12}")
    for i, (label, _, _) in enumerate(FIGURES):
        row = "".join(f"{values[i]:>14,.0f}" for values in results.values())
        ratio = f"{results['this'][i] / results['baseline'][i]:>12.2f}" if baseline else ""
        print(f"  {label:<28}{row}{ratio}")


def pair(text: str) -> tuple[int, int]:
    few, more = (int(x) for x in text.split(","))
    return few, more


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, role, script, n, out = sys.argv
        asyncio.run(child(role, script, int(n), out))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", help="another checkout to compare with")
    parser.add_argument("--turns", type=pair, default=(5, 25))
    parser.add_argument("--calls", type=pair, default=(200, 1200))
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured")
        sys.exit(0)
    baseline = str(Path(args.baseline).resolve()) if args.baseline else None
    asyncio.run(main(baseline, args.turns, args.calls))
