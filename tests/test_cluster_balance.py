"""Fair shares: who gives how many agents to whom (`server/cluster/balance.py`)."""

from __future__ import annotations

from server.cluster.balance import drain_targets, fair_ceiling, hand_outs


def test_a_replica_holding_everything_gives_each_newcomer_its_share() -> None:
    shares = {"r0": 30, "r1": 0, "r2": 0}
    targets = hand_outs(shares, "r0")
    assert len(targets) == 20
    assert targets.count("r1") == 10 and targets.count("r2") == 10


def test_a_replica_within_its_share_gives_nothing() -> None:
    assert hand_outs({"r0": 3, "r1": 2}, "r0") == []
    assert hand_outs({"r0": 2, "r1": 3}, "r0") == []
    assert hand_outs({"r0": 5}, "r0") == []  # alone
    assert hand_outs({"r1": 5}, "r0") == []  # not taking agents (draining)


def test_two_givers_fill_the_newcomer_without_overshooting() -> None:
    shares = {"r0": 15, "r1": 15, "r2": 0}
    given = hand_outs(shares, "r0") + hand_outs(shares, "r1")
    assert given == ["r2"] * 10
    assert fair_ceiling(shares) == 10


def test_one_more_move_that_would_not_narrow_the_gap_is_not_made() -> None:
    assert hand_outs({"r0": 4, "r1": 3, "r2": 3}, "r0") == []  # 10 over 3: 4 is the ceiling
    assert hand_outs({"r0": 2, "r1": 1, "r2": 0}, "r0") == ["r2"]  # 1 each
    assert hand_outs({"r0": 2, "r1": 1}, "r0") == []  # 2 and 1: the best spread of 3


def test_a_drain_spreads_its_agents_over_the_others_fewest_first() -> None:
    assert drain_targets({"r1": 2, "r2": 0}, 4) == ["r2", "r2", "r1", "r2"]
    assert drain_targets({}, 3) == []
