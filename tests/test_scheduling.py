"""Weighted fair share across priority levels."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from ponder.scheduling import WeightedFairPicker

QUOTAS = [4, 3, 2, 2, 1, 1]


def test_order_is_a_permutation_of_levels() -> None:
    picker = WeightedFairPicker(QUOTAS)
    for _ in range(50):
        order = picker.order()
        assert sorted(order) == list(range(6))


def test_order_first_level_matches_quotas_every_cycle() -> None:
    picker = WeightedFairPicker(QUOTAS)
    for _ in range(5):  # exact per cycle of sum(quotas) calls, cycle after cycle
        firsts = Counter(picker.order()[0] for _ in range(sum(QUOTAS)))
        assert [firsts[level] for level in range(6)] == QUOTAS


def test_order_interleaves_rather_than_runs() -> None:
    picker = WeightedFairPicker(QUOTAS)
    firsts = [picker.order()[0] for _ in range(3 * sum(QUOTAS))]
    runs = [1]
    for before, after in itertools.pairwise(firsts):
        runs.append(runs[-1] + 1 if after == before else 1)
    assert max(runs) <= 2, firsts


def test_flood_of_priority_0_cannot_starve_priority_5() -> None:
    picker = WeightedFairPicker(QUOTAS)
    # 10,000 urgent requests and one of the lowest priority: it is in the first batch.
    taken = picker.pick({0: 10_000, 5: 1}, 8)
    assert taken[5] == 1
    assert taken[0] == 7


def test_lowest_priority_served_within_one_cycle_under_full_contention() -> None:
    picker = WeightedFairPicker(QUOTAS)
    waiting = {level: 1_000 for level in range(6)}
    served5 = 0
    for batch in range(2):  # 2 batches of 8 > one cycle of 13 slots
        taken = picker.pick(waiting, 8)
        served5 += taken[5]
        assert sum(taken) == 8, batch
    assert served5 >= 1


def test_pick_shares_converge_to_quotas() -> None:
    picker = WeightedFairPicker(QUOTAS)
    waiting = {level: 10**9 for level in range(6)}
    totals = [0] * 6
    batches = 13 * 40  # a whole number of cycles of 8-slot batches
    for _ in range(batches):
        for level, n in enumerate(picker.pick(waiting, 8)):
            totals[level] += n
    slots = 8 * batches
    assert totals == [slots * q // sum(QUOTAS) for q in QUOTAS]


def test_pick_shares_among_busy_levels_only() -> None:
    picker = WeightedFairPicker(QUOTAS)
    totals = [0] * 6
    for _ in range(100):
        for level, n in enumerate(picker.pick({1: 500, 4: 500}, 8)):
            totals[level] += n
    # levels 1 and 4 split 3:1; idle levels bank nothing
    assert totals[1] == 600 and totals[4] == 200
    assert sum(totals) == 800


def test_pick_takes_everything_when_it_fits_and_never_more_than_available() -> None:
    picker = WeightedFairPicker(QUOTAS)
    assert picker.pick({0: 2, 3: 1}, 8) == [2, 0, 0, 1, 0, 0]
    assert picker.pick({}, 8) == [0] * 6
    taken = picker.pick({0: 1, 1: 1, 5: 30}, 8)
    assert taken == [1, 1, 0, 0, 0, 6]
    assert picker.pick({0: 5}, 0) == [0] * 6


def test_pick_uneven_availability_fills_k() -> None:
    picker = WeightedFairPicker(QUOTAS)
    for avail in ({0: 3, 5: 20}, {2: 1, 3: 1, 4: 40}, {0: 9, 1: 9}):
        taken = picker.pick(avail, 8)
        assert sum(taken) == 8
        assert all(taken[lv] <= avail.get(lv, 0) for lv in range(6))


@pytest.mark.parametrize(
    ("quotas", "message"),
    [
        ([], "at least one"),
        ([4, 0, 1], "priority 1"),
        ([4, -1], "priority 1"),
        ([4, 1.5], "priority 1"),
        ([True, 1], "priority 0"),
    ],
)
def test_invalid_quotas(quotas: list[object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WeightedFairPicker(quotas)  # type: ignore[arg-type]


def test_invalid_pick_arguments() -> None:
    picker = WeightedFairPicker(QUOTAS)
    with pytest.raises(ValueError, match="unknown priority level 6"):
        picker.pick({6: 1}, 1)
    with pytest.raises(ValueError, match="negative"):
        picker.pick({0: -1}, 1)
    with pytest.raises(ValueError, match="non-negative"):
        picker.pick({0: 1}, -1)


def test_single_level() -> None:
    picker = WeightedFairPicker([3])
    assert picker.order() == [0]
    assert picker.pick({0: 10}, 4) == [4]
    assert picker.levels == 1 and picker.quotas == (3,)
