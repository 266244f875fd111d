"""The math-verify process pool: bounded, and a comparison over its timeout has its worker
killed and replaced (a thread could not stop sympy inside C code)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from ponder.enhance.mathverify import MathVerifyPool, get_pool, shutdown_pool


@pytest.fixture
def pool() -> Iterator[MathVerifyPool]:
    p = MathVerifyPool(timeout_s=5.0, max_pending=4)
    yield p
    p.close()


@pytest.mark.timeout(120)
def test_equal_and_different_expressions() -> None:
    pool = MathVerifyPool(timeout_s=30.0)  # generous: the CPU may be shared
    try:
        assert pool.same("\\sqrt{4}", "2")
        assert pool.same("x^2+2x+1", "(x+1)^2")
        assert not pool.same("\\sqrt{2}", "2")
    finally:
        pool.close()


@pytest.mark.timeout(120)
def test_a_comparison_stuck_in_c_is_killed_and_the_worker_replaced(pool: MathVerifyPool) -> None:
    assert pool.same("\\sqrt{9}", "3")  # a warm worker
    killed, started = pool.killed, time.monotonic()
    # time.sleep holds its worker inside C code, as a runaway sympy call would
    assert pool.run(time.sleep, 120, default="timed out") == "timed out"
    assert time.monotonic() - started < 60
    assert pool.killed == killed + 1
    assert pool.same("\\frac{1}{2}", "0.5")  # a fresh worker took the dead one's place


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="workers"):
        MathVerifyPool(workers=0)


@pytest.mark.timeout(120)
def test_a_closed_pool_answers_the_default_and_the_shared_one_restarts() -> None:
    p = MathVerifyPool()
    p.close()
    assert p.run(time.sleep, 0, default="closed") == "closed"
    shared = get_pool()
    shutdown_pool()
    assert get_pool() is not shared
    shutdown_pool()
