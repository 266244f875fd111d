"""The ``ponder`` command line: run the service (all-in-one or split roles) and use it.

Every command is registered here, from the module of its concern: :mod:`.run` (running
the service), :mod:`.tasks` (using one), :mod:`.keys` (keys and secrets).
"""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from ponder.cli import keys, run, tasks
from ponder.cli.base import console
from ponder.cli.progress import TaskProgress

__all__ = ["TaskProgress", "app", "main"]

app = typer.Typer(
    help="ponder: asynchronous LLM inference as tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from ponder.version import __version__

        console.print(f"ponder {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="print the installed version and exit",
        ),
    ] = False,
) -> None:
    pass


for command in (run.serve, run.api, run.worker, *tasks.COMMANDS):
    app.command()(command)
app.command(
    "list",
    help="List your tasks, newest first: the same as `ponder tasks` (the SDK's `Client.list`).",
)(tasks.tasks)

keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
keys_app.command("new")(keys.new)
keys_app.command("webhook-secret")(keys.webhook_secret)
app.add_typer(keys_app, name="keys")


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        app()
