"""Fair shares of agents among replicas: who gives how many agents to whom.

Pure arithmetic over the lease counts (`Leases.shares`: each replica that takes
agents, and how many leases it holds). A replica above the ceiling of the mean gives
agents one at a time to the replica with the fewest (ties by id, so every replica
computes the same plan), while that still narrows the gap; a draining replica gives
every agent it has, each to the replica with the fewest at that moment.
"""

from __future__ import annotations


def fair_ceiling(shares: dict[str, int]) -> int:
    """The most agents a replica holds when they are spread evenly."""
    return -(-sum(shares.values()) // len(shares)) if shares else 0


def hand_outs(shares: dict[str, int], me: str) -> list[str]:
    """The replicas `me` gives one agent each to, so that it holds no more than its share."""
    if me not in shares or len(shares) < 2:
        return []
    counts = dict(shares)
    ceiling = fair_ceiling(counts)
    targets: list[str] = []
    while counts[me] > ceiling:
        fewest = min(sorted(r for r in counts if r != me), key=counts.__getitem__)
        if counts[fewest] + 1 >= counts[me]:
            break  # moving one more would not narrow the gap
        counts[fewest] += 1
        counts[me] -= 1
        targets.append(fewest)
    return targets


def drain_targets(shares: dict[str, int], agents: int) -> list[str]:
    """Where each of a draining replica's `agents` goes (`shares`: the other replicas)."""
    counts = dict(shares)
    targets: list[str] = []
    for _ in range(agents if counts else 0):
        fewest = min(sorted(counts), key=counts.__getitem__)
        counts[fewest] += 1
        targets.append(fewest)
    return targets
