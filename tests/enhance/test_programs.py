"""A program-of-thought program runs as a notebook cell: its last bare expression's value
is printed (real outputs of the quality collection: ``65 + 71`` printed nothing)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ponder.enhance.programs import printing_last_expression

pytestmark = pytest.mark.timeout(30)


def run(program: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", printing_last_expression(program)],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    return done.stdout


@pytest.mark.parametrize(
    ("program", "printed"),
    [
        ("65 + 71", "136\n"),
        ("x = 3\ny = 4\nx * y", "12\n"),
        ("result = 3\nresult  # the answer", "3\n"),
        ("a = 1; a + 1", "2\n"),
        ("(1 +\n 2)", "3\n"),
        ('"Jupiter"', "Jupiter\n"),
        # already printing: unchanged, printed once
        ("print(5)", "5\n"),
        ("x = 2\nprint(x)", "2\n"),
        # a last call that prints and returns None prints no "None"
        ("def main():\n    print(42)\n\nmain()", "42\n"),
        # no expression last: unchanged
        ("x = 3", ""),
        ("for i in range(2):\n    i", ""),
    ],
)
def test_the_last_bare_expression_is_printed(program: str, printed: str) -> None:
    assert run(program) == printed


def test_a_program_that_does_not_parse_is_left_as_it_is() -> None:
    assert printing_last_expression("print(1") == "print(1"
    assert printing_last_expression("") == ""
