"""What every command of the ``ponder`` command line shares: the consoles, the exit
codes, the settings and logging of the commands that run the service, the JSON output."""

from __future__ import annotations

import json
import logging
from typing import Any

import typer
from rich.console import Console

from ponder.config import Settings, load_settings
from ponder.errors import ConfigError
from ponder.types import TaskStatus

__all__ = [
    "EXIT_OK",
    "EXIT_TASK_FAILED",
    "EXIT_USAGE",
    "console",
    "err_console",
    "exit_code",
    "fail",
    "print_json",
    "settings_and_logging",
]

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # a message stays one line, never wrapped

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print ``error: message`` on stderr (one line) and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


def settings_and_logging(**overrides: Any) -> Settings:
    """The settings (the environment, then the command's options that were given), and
    logging at their ``log_level``; a bad setting is one line and exit 2."""
    try:
        settings = load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as e:
        raise fail(str(e)) from e
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return settings


def exit_code(status: TaskStatus | str) -> int:
    return EXIT_OK if status in ("done", "partial_done") else EXIT_TASK_FAILED


def print_json(data: Any) -> None:
    # plain print: rich would wrap long lines of a JSON document
    print(json.dumps(data, indent=2, ensure_ascii=False))
