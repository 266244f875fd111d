"""The ``ponder`` command line: run the service (all-in-one or split roles) and use it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import time
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from ponder.config import Mode, Settings, load_settings
from ponder.errors import ConfigError

app = typer.Typer(
    help="ponder: asynchronous LLM inference as tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

console = Console()
err_console = Console(stderr=True)

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2
_DEFAULT_URL = "http://127.0.0.1:8000"


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e


def _logging() -> None:
    level = os.environ.get("PONDER_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level if level in logging.getLevelNamesMapping() else "INFO",
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _serve_http(settings: Settings, workers: int) -> None:
    import uvicorn

    from ponder.api import create_app

    if not settings.api_keys:
        err_console.print(
            "[yellow]auth is off[/yellow] (PONDER_API_KEYS unset): anyone who can reach "
            f"{settings.host}:{settings.port} can submit and read tasks"
        )
    store = f"Redis at {settings.redis_url}" if settings.redis_url else settings.sqlite_path
    err_console.print(
        f"ponder on http://{settings.host}:{settings.port} — store: {store}; "
        f"engine: {settings.engine if workers else '(none: api only)'}"
    )
    uvicorn.run(
        create_app(settings, workers=workers),
        host=settings.host,
        port=settings.port,
        log_level=os.environ.get("PONDER_LOG_LEVEL", "info").lower(),
        timeout_graceful_shutdown=int(settings.shutdown_grace_s) + 1,
    )


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address [PONDER_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [PONDER_PORT]")] = None,
    workers: Annotated[int, typer.Option(min=1, help="worker loops in this process")] = 1,
) -> None:
    """All in one process: the API plus workers (embedded SQLite unless PONDER_REDIS_URL)."""
    _logging()
    _serve_http(_settings(host=host, port=port), workers)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="bind address [PONDER_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [PONDER_PORT]")] = None,
) -> None:
    """The API only; workers run elsewhere (`ponder worker`) over the same Redis."""
    _logging()
    settings = _settings(host=host, port=port)
    if not settings.redis_url:
        err_console.print(
            "[red]error:[/red] `ponder api` needs PONDER_REDIS_URL (workers must share the "
            "store); use `ponder serve` for one process"
        )
        raise typer.Exit(EXIT_USAGE)
    _serve_http(settings, workers=0)


@app.command()
def worker(
    workers: Annotated[int, typer.Option(min=1, help="worker loops in this process")] = 1,
) -> None:
    """A worker process: claims tasks from Redis and runs them through the engine."""
    _logging()
    settings = _settings()
    if not settings.redis_url:
        err_console.print(
            "[red]error:[/red] `ponder worker` needs PONDER_REDIS_URL; "
            "use `ponder serve` for the embedded store"
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        asyncio.run(_run_worker(settings, workers))
    except ConfigError as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e


async def _run_worker(settings: Settings, workers: int) -> None:
    from ponder.runtime import WorkerRuntime
    from ponder.store import create_store

    store = create_store(settings)
    await store.start()
    runtime = WorkerRuntime(settings, store, workers=workers)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runtime.start()
        err_console.print(f"worker {settings.node_id} running ({workers} loop(s))")
        waiter = asyncio.create_task(runtime.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if waiter.done():
            waiter.result()
        err_console.print("worker stopping: finishing running tasks")
    finally:
        await runtime.stop()
        await store.close()


def _client(url: str) -> httpx.Client:
    headers = {}
    if key := os.environ.get("PONDER_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=url, headers=headers, timeout=30.0)


def _fail(response: httpx.Response) -> None:
    try:
        error = response.json()["error"]
        message = f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        message = response.text[:200]
    err_console.print(f"[red]error {response.status_code}[/red] {message}")
    raise typer.Exit(EXIT_USAGE if response.status_code in (400, 413, 422) else EXIT_TASK_FAILED)


def _print_task(task: dict[str, Any]) -> None:
    status = task["status"]
    result = task.get("result") or {}
    color = {"done": "green", "partial_done": "yellow"}.get(status, "red")
    console.print(f"[bold]{task['id']}[/bold] [{color}]{status}[/{color}]")
    if result:
        console.print(f"answer: [bold]{result.get('answer')}[/bold]")
        console.print(
            f"confidence {result.get('confidence', 0):.2f} · "
            f"agreement {result.get('agreement', 0):.2f}"
        )
        votes = Table("answer", "votes")
        for answer, count in sorted(result.get("votes", {}).items(), key=lambda kv: -kv[1]):
            votes.add_row(str(answer), str(count))
        console.print(votes)
        console.print(result.get("text", ""))
    if task.get("error"):
        console.print(f"error: {task['error']['code']}: {task['error']['message']}")


@app.command()
def submit(
    prompt: Annotated[str, typer.Argument(help="the prompt")],
    mode: Annotated[Mode, typer.Option(help="fast, standard or deep")] = Mode.standard,
    priority: Annotated[int, typer.Option(min=0, max=5, help="0 is the most urgent")] = 3,
    wait: Annotated[bool, typer.Option(help="wait for the result and print it")] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait with --wait")] = 600,
    as_json: Annotated[bool, typer.Option("--json", help="print the Task as JSON")] = False,
    url: Annotated[str, typer.Option(envvar="PONDER_URL", help="service URL")] = _DEFAULT_URL,
) -> None:
    """Submit a task. Exit 0 on done/partial_done, 1 on failed/cancelled, 2 on usage errors."""
    with _client(url) as client:
        try:
            response = client.post(
                "/v1/tasks", json={"prompt": prompt, "mode": mode.value, "priority": priority}
            )
            if response.status_code >= 400:
                _fail(response)
            task = response.json()
            if wait:
                task = _wait(client, task["id"], timeout)
        except httpx.HTTPError as e:
            err_console.print(f"[red]error:[/red] cannot reach {url}: {e}")
            raise typer.Exit(EXIT_TASK_FAILED) from e
    if as_json:
        console.print_json(json.dumps(task))
    elif wait:
        _print_task(task)
    else:
        console.print(task["id"])
    if wait and task["status"] not in ("done", "partial_done"):
        raise typer.Exit(EXIT_TASK_FAILED)


def _wait(client: httpx.Client, task_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        response = client.get(f"/v1/tasks/{task_id}")
        if response.status_code >= 400:
            _fail(response)
        task: dict[str, Any] = response.json()
        if task["status"] in ("done", "partial_done", "failed", "cancelled"):
            return task
        if time.monotonic() > deadline:
            err_console.print(f"[red]timed out[/red] after {timeout_s:g}s; task {task_id} goes on")
            raise typer.Exit(EXIT_TASK_FAILED)
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


@keys_app.command("new")
def keys_new() -> None:
    """Print a fresh API key and the digest to put in PONDER_API_KEYS."""
    from ponder.api.deps import key_digest

    key = "pk_" + secrets.token_urlsafe(32)
    console.print(f"key:    {key}")
    console.print(f"digest: {key_digest(key)}")
    console.print("Give the key to the client; add the digest to PONDER_API_KEYS.")


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        app()


if __name__ == "__main__":
    main()
