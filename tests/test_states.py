from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ponder.errors import InvalidTransition
from ponder.states import TERMINAL, check_transition, is_terminal
from ponder.types import TaskStatus as S

ALLOWED = {
    (S.pending, S.running),
    (S.pending, S.cancelled),
    (S.pending, S.expired),
    (S.running, S.done),
    (S.running, S.partial_done),
    (S.running, S.failed),
    (S.running, S.cancelled),
}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_exactly_the_api_md_transitions(old: S, new: S) -> None:
    if (old, new) in ALLOWED:
        check_transition(old, new)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(old, new)


def test_terminal_states() -> None:
    assert {S.done, S.partial_done, S.failed, S.cancelled, S.expired} == TERMINAL
    assert not is_terminal(S.pending)
    assert not is_terminal("running")


@given(st.lists(st.sampled_from(list(S)), max_size=12))
def test_terminal_states_never_change(path: list[S]) -> None:
    state = S.pending
    for nxt in path:
        try:
            check_transition(state, nxt)
        except InvalidTransition:
            continue
        assert not is_terminal(state)
        state = nxt
    if is_terminal(state):
        for nxt in S:
            with pytest.raises(InvalidTransition):
                check_transition(state, nxt)
