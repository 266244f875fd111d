from __future__ import annotations

import multiprocessing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponder.ids import IdGenerator, parse_task_id, sort_key


def _make_ids(node: str) -> list[str]:
    gen = IdGenerator(node)
    return [gen.new_id() for _ in range(10_000)]


def test_format_matches_api_md() -> None:
    task_id = IdGenerator("api1").new_id()
    parsed = parse_task_id(task_id)
    assert parsed is not None
    assert len(task_id.split("-")[0]) == 13
    assert parsed.node == "api1"
    assert parsed.seq == 1


@pytest.mark.slow
def test_unique_across_four_processes() -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        batches = pool.map(_make_ids, ["n.1", "n.2", "n.3", "n.4"])
    ids = [i for batch in batches for i in batch]
    assert len(ids) == 40_000
    assert len(set(ids)) == 40_000


def test_bad_node_refused() -> None:
    with pytest.raises(ValueError, match="node id"):
        IdGenerator("bad node!")


@pytest.mark.parametrize(
    "text", ["", "abc", "123-n-1", "1764412800123-n-", "1764412800123--1", "1764412800123-a b-1"]
)
def test_parse_rejects_malformed(text: str) -> None:
    assert parse_task_id(text) is None


@given(
    ms=st.integers(min_value=10**12, max_value=10**13 - 1),
    node=st.from_regex(r"[A-Za-z0-9_.]{1,20}", fullmatch=True),
    seq=st.integers(min_value=1, max_value=10**15),
)
def test_parse_roundtrip(ms: int, node: str, seq: int) -> None:
    parsed = parse_task_id(f"{ms}-{node}-{seq}")
    assert parsed is not None
    assert (parsed.ms, parsed.node, parsed.seq) == (ms, node, seq)


@given(st.text(max_size=40))
def test_parse_never_raises(text: str) -> None:
    parse_task_id(text)


def test_sort_key_orders_by_creation() -> None:
    gen = IdGenerator("x")
    ids = [gen.new_id() for _ in range(50)]
    assert sorted(ids, key=sort_key) == ids
