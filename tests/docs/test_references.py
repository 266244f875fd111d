"""docs/cli.md names every command and option of ``ponder``; docs/sdk.md every public
method of ``Client`` and ``AsyncClient``."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main

from ponder.cli import app
from ponder.client import AsyncClient, Client
from tests.docs.markdown import ROOT

CLI_PAGE = ROOT / "docs" / "cli.md"
SDK_PAGE = ROOT / "docs" / "sdk.md"


def _commands(group: Any, prefix: str = "ponder") -> Iterator[tuple[str, Any]]:
    """Each (sub)command of a click group (typer may bring a click of its own: duck-typed)."""
    for name, command in group.commands.items():
        yield f"{prefix} {name}", command
        if hasattr(command, "commands"):
            yield from _commands(command, f"{prefix} {name}")


def _options() -> list[tuple[str, str]]:
    root: Any = typer.main.get_command(app)
    assert hasattr(root, "commands")
    out = [("ponder", opt) for p in root.params for opt in p.opts if opt != "--help"]
    for name, command in _commands(root):
        out.append((name, ""))
        out += [(name, opt) for p in command.params for opt in p.opts if opt.startswith("--")]
    return [o for o in out if o[1] != "--help"]


def test_the_cli_is_read() -> None:
    names = {name for name, _ in _options()}
    assert {"ponder serve", "ponder submit", "ponder keys new"} <= names


@pytest.mark.parametrize("command,option", _options())
def test_every_command_and_option_is_in_cli_md(command: str, option: str) -> None:
    text = CLI_PAGE.read_text(encoding="utf-8")
    assert f"`{command}" in text, f"docs/cli.md does not name `{command}`"
    if option:
        assert f"`{option}`" in text or f"{option} " in text, f"{command} {option}"


def _methods(cls: type) -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    ]


@pytest.mark.parametrize("name", sorted(set(_methods(Client)) | set(_methods(AsyncClient))))
def test_every_sdk_method_is_in_sdk_md(name: str) -> None:
    text = SDK_PAGE.read_text(encoding="utf-8")
    assert f"Client.{name}" in text or f"`{name}(" in text or f"{name}(" in text, name
    assert {"submit", "get", "cancel", "list", "events", "wait", "close"} <= set(_methods(Client))
