"""Program-of-thought programs as a notebook cell runs them.

A model asked for a program that prints its answer often writes the computation as a
bare expression (```` ```python\\n65 + 71\\n``` ````) and no ``print``: run as a script,
it prints nothing and the sample states no answer. Like a notebook cell (IPython's
``last_expr`` rule), a program whose last statement is an expression that is not
already a ``print(...)`` call gets that statement's value printed (unless it is None:
``main()`` that prints and returns nothing prints no ``None`` after its output).
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from ponder.enhance.fences import extract_program_output
from ponder.enhance.sandbox import SandboxResult, run_python_async

if TYPE_CHECKING:
    from ponder.config import Settings

__all__ = ["printing_last_expression", "run_program"]


async def run_program(text: str, settings: Settings) -> SandboxResult | None:
    """Run the program in a program-of-thought sample's text (its last ``python`` block)
    in the sandbox, its last bare expression printed; None if the text holds none."""
    program = extract_program_output(text)
    if program is None:
        return None
    return await run_python_async(
        printing_last_expression(program),
        timeout_s=settings.sandbox_timeout_s,
        memory_mb=settings.sandbox_memory_mb,
        isolation=settings.sandbox_isolation,
    )


def printing_last_expression(program: str) -> str:
    """``program`` with the value of its last statement printed when that statement is a
    bare expression other than a ``print`` call and its value is not None; otherwise (or
    when it does not parse) unchanged."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError):
        return program
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return program
    last = tree.body[-1]
    call = last.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print":
        return program
    lines = program.splitlines()
    start, end = last.lineno - 1, (last.end_lineno or last.lineno) - 1
    head = lines[start][: last.col_offset]
    tail = lines[end][last.end_col_offset :] if last.end_col_offset is not None else ""
    expression = ast.get_source_segment(program, last) or ast.unparse(last)
    shown = f"(_ponder_value := ({expression})) is None or print(_ponder_value)"
    return "\n".join([*lines[:start], f"{head}{shown}{tail}", *lines[end + 1 :]])
