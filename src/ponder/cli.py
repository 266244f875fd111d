"""The ``ponder`` command line: run the service (all-in-one or split roles) and use it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
import uvloop
from rich import box
from rich.columns import Columns
from rich.console import Console, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Column, Table
from rich.text import Text

from ponder.config import Settings, load_settings
from ponder.errors import ConfigError
from ponder.types import (
    DEFAULT_MODE,
    EventName,
    Mode,
    Result,
    Sample,
    SampleStatus,
    Task,
    TaskStatus,
    TaskType,
)

if TYPE_CHECKING:
    from ponder.client import Client, TaskEvent

app = typer.Typer(
    help="ponder: asynchronous LLM inference as tasks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
keys_app = typer.Typer(help="API keys.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # a message stays one line, never wrapped

EXIT_OK, EXIT_TASK_FAILED, EXIT_USAGE = 0, 1, 2
_DEFAULT_URL = "http://127.0.0.1:8000"


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


def _engine_line(settings: Settings) -> str:
    if settings.engine in ("openvino", "transformers"):
        return f"{settings.engine} ({settings.model}, {settings.engine_threads} thread(s))"
    return settings.engine


def _listen(settings: Settings) -> socket.socket:
    """The server's socket, bound and listening before anything else starts (a model
    takes seconds to load; a port in use is known at once)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        return socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    except OSError as e:
        why = (e.strerror or str(e)).split(" (while attempting", 1)[0]  # create_server's addition
        err_console.print(
            f"[red]error:[/red] cannot listen on {settings.host}:{settings.port} ({why}): "
            "give a free port with --port or PONDER_PORT (and an address of this machine "
            "with --host or PONDER_HOST)"
        )
        raise typer.Exit(EXIT_USAGE) from None


def _serve_http(settings: Settings, workers: int, processes: int = 1) -> None:
    """Serve the API on the listening socket: in this process, or in ``processes`` API
    processes sharing it (uvicorn's supervisor: each imports
    ``create_app_from_environment``; a child that dies is replaced)."""
    import uvicorn

    from ponder.api import create_app
    from ponder.store import create_store

    listener = _listen(settings)
    port = listener.getsockname()[1]  # the one picked when PONDER_PORT is 0
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    if not settings.api_keys:
        err_console.print(
            "[yellow]auth is off[/yellow] (PONDER_API_KEYS unset): anyone who can reach "
            f"{host}:{port} can submit and read tasks"
        )
    store = create_store(settings).describe()  # no connection yet: only its name
    err_console.print(
        f"ponder on http://{host}:{port} — store: {store}; "
        f"engine: {_engine_line(settings) if workers else '(none: api only)'}"
    )
    log_level = os.environ.get("PONDER_LOG_LEVEL", "info").lower()
    grace = int(settings.shutdown_grace_s) + 1
    if processes > 1:
        _serve_processes(listener, processes, f"http://{host}:{port}", log_level, grace)
        return
    if workers:
        from ponder.compose import all_in_one

        try:
            application = all_in_one(settings, workers=workers).app
        except ConfigError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(EXIT_USAGE) from None
    else:
        application = create_app(settings)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            # uvicorn says this only of sockets it binds itself
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, port
            )

    server = Server(
        uvicorn.Config(
            application,
            host=settings.host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=grace,
        )
    )
    # uvicorn re-raises the signal it stopped on once it has shut down (as uvicorn.run):
    # SIGINT as KeyboardInterrupt, SIGTERM through this handler, so both end with code 0
    signal.signal(signal.SIGTERM, _terminated)
    try:
        with listener:
            server.run(sockets=[listener])
    except (KeyboardInterrupt, _Terminated):
        pass
    except SystemExit:  # uvicorn's exit when the start-up failed
        error = getattr(application.state, "startup_error", None)
        if error is None:
            raise
        err_console.print(f"[red]error:[/red] {error}")
        raise typer.Exit(EXIT_USAGE) from None


class _Terminated(Exception):
    """SIGTERM arrived: ``ponder serve`` / ``ponder api`` shut down as asked."""


def _terminated(signum: int, frame: object) -> None:
    raise _Terminated


def _serve_processes(
    listener: socket.socket, processes: int, url: str, log_level: str, grace: int
) -> None:
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    config = uvicorn.Config(
        "ponder.api.app:create_app_from_environment",
        factory=True,
        workers=processes,
        log_level=log_level,
        timeout_graceful_shutdown=grace,
    )
    supervisor = Multiprocess(config, sockets=[listener])
    logging.getLogger("uvicorn.error").info(
        "Uvicorn running on %s with %d API processes (Press CTRL+C to quit)", url, processes
    )
    with listener:
        supervisor.run()
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        err_console.print("[red]error:[/red] an API process failed to start (its log is above)")
        raise typer.Exit(1)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address [PONDER_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [PONDER_PORT]")] = None,
    workers: Annotated[int, typer.Option(min=1, help="worker loops in this process")] = 1,
) -> None:
    """All in one process: the API plus workers (embedded SQLite unless PONDER_REDIS_URL).

    Engine: PONDER_ENGINE, by default `openvino` (OpenVINO GenAI, continuous batching).

    It runs PONDER_MODEL (default: the packaged SmolLM2-135M) in an engine process of its own.

    Threads: PONDER_ENGINE_THREADS; rows at once: PONDER_ENGINE_MAX_ROWS.

    The first start writes the model's weights into PONDER_MODEL_CACHE_DIR (seconds).
    """
    _logging()
    _serve_http(_settings(host=host, port=port), workers)


@app.command()
def api(
    host: Annotated[str | None, typer.Option(help="bind address [PONDER_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [PONDER_PORT]")] = None,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="API processes sharing the port (as uvicorn's --workers); a process that "
            "dies is replaced",
        ),
    ] = 1,
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
    _serve_http(settings, workers=0, processes=processes)


@app.command()
def worker(
    workers: Annotated[int, typer.Option(min=1, help="worker loops in this process")] = 1,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            show_default=False,
            help="serve this process's Prometheus metrics on this port, at /metrics "
            "(bound to PONDER_HOST) [PONDER_METRICS_PORT]",
        ),
    ] = None,
) -> None:
    """A worker process: claims tasks from Redis and runs them through the engine.

    Waits for Redis at start-up (one line per attempt) and rides out Redis outages.
    """
    _logging()
    settings = _settings(metrics_port=metrics_port)
    if not settings.redis_url:
        err_console.print(
            "[red]error:[/red] `ponder worker` needs PONDER_REDIS_URL; "
            "use `ponder serve` for the embedded store"
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        uvloop.run(_run_worker(settings, workers))  # as uvicorn runs the API's loop
    except ConfigError as e:
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e


def _serve_metrics(settings: Settings) -> Callable[[], None] | None:
    """Serve the process's Prometheus registry on ``metrics_port`` (a thread of
    prometheus_client's own); return the function that stops it."""
    if settings.metrics_port is None:
        return None
    from prometheus_client import start_http_server

    from ponder import metrics

    address = f"{settings.host}:{settings.metrics_port}"
    try:
        server, thread = start_http_server(
            settings.metrics_port, addr=settings.host, registry=metrics.REGISTRY
        )
    except OSError as e:
        raise ConfigError(
            f"cannot serve metrics on {address} ({e.strerror or e}); set PONDER_METRICS_PORT "
            "(or --metrics-port) to a free port, or PONDER_HOST to an address of this machine"
        ) from e
    err_console.print(f"metrics on http://{address}/metrics")

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(5)

    return stop


async def _run_worker(settings: Settings, workers: int) -> None:
    from ponder.runtime import WorkerRuntime
    from ponder.store import create_store, start_store

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = create_store(settings)
    stop_metrics = _serve_metrics(settings)
    runtime: WorkerRuntime | None = None
    try:
        if not await start_store(store, stop=stop):
            err_console.print("worker stopping: the store never answered")
            return
        runtime = WorkerRuntime(settings, store, workers=workers)
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
        if runtime is not None:
            await runtime.stop()
        await store.close()
        if stop_metrics is not None:
            stop_metrics()


# --- using a service ------------------------------------------------------------------
UrlOption = Annotated[
    str, typer.Option("--url", envvar="PONDER_URL", help="service URL [PONDER_URL]")
]
KeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key", envvar="PONDER_API_KEY", show_default=False, help="API key [PONDER_API_KEY]"
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


def _exit_code(status: TaskStatus | str) -> int:
    return EXIT_OK if status in ("done", "partial_done") else EXIT_TASK_FAILED


@contextlib.contextmanager
def _service(url: str, api_key: str | None) -> Iterator[Client]:
    """An SDK client; its errors become a message on stderr and an exit code."""
    from ponder.client import APIConnectionError, APIError, Client, WaitTimeout

    try:
        with Client(url, api_key=api_key or None) as client:
            yield client
    except APIError as e:
        err_console.print(f"[red]error {e.status_code}[/red] {e.code}: {e.message}")
        usage = e.status_code in (400, 413, 422)
        raise typer.Exit(EXIT_USAGE if usage else EXIT_TASK_FAILED) from e
    except APIConnectionError as e:
        err_console.print(f"[red]error:[/red] cannot reach {url}: {e}")
        raise typer.Exit(EXIT_TASK_FAILED) from e
    except WaitTimeout as e:
        err_console.print(f"[red]timed out[/red]: {e}; the task goes on")
        raise typer.Exit(EXIT_TASK_FAILED) from e
    except ConfigError as e:  # a malformed PONDER_URL / PONDER_API_KEY
        err_console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(EXIT_USAGE) from e


def _print_json(data: Any) -> None:
    # plain print: rich would wrap long lines of a JSON document
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _vote_table(votes: dict[str, int], title: str | None = None) -> Table:
    table = Table("answer", "votes", title=title, title_justify="left", box=None)
    for answer, count in sorted(votes.items(), key=lambda kv: -kv[1]):
        table.add_row(answer, str(count))
    return table


def _print_task(task: Task) -> None:
    status = task.status.value
    color = {"done": "green", "partial_done": "yellow", "running": "cyan", "pending": "cyan"}
    tint = color.get(status, "red")
    console.print(
        f"[bold]{task.id}[/bold] [{tint}]{status}[/{tint}] · {task.mode} · "
        f"{task.samples_done}/{task.samples_planned} samples"
    )
    result = task.result
    if result is not None:
        console.print(f"answer: [bold]{result.answer}[/bold]")
        facts = [f"confidence {result.confidence:.2f}", f"agreement {result.agreement:.2f}"]
        if result.stage is not None:  # auto mode: where the cascade ended
            facts.append(f"stage {result.stage} of 3")
        if result.stop_reason is not None:
            facts.append(f"stopped: {result.stop_reason}")
        console.print(" · ".join(facts))
        if result.votes:
            console.print(_vote_table(result.votes))
        if result.clarification:
            console.print(f"[yellow]clarification:[/yellow] {result.clarification}")
        console.print(result.text)
    elif task.preliminary is not None:
        console.print(f"preliminary answer: [bold]{task.preliminary.answer}[/bold]")
    if task.error is not None:
        console.print(f"error: {task.error.code}: {task.error.message}")


class TaskProgress:
    """The live view of a running task, built from its events: samples finished out of
    planned, the vote so far, the preliminary answer, and one line per sample whose text
    grows as the model writes it (``delta`` events), then shows its answer."""

    def __init__(self, task: Task, width: int = 100) -> None:
        self.task_id = task.id
        self.status = task.status.value
        self.planned = task.samples_planned
        self.finished = 0
        self.votes: Counter[str] = Counter()
        self.preliminary: Result | None = None
        #: each sample's text so far, and the mark of its state
        self.texts: dict[int, str] = {}
        self.marks: dict[int, str] = {}
        self.width = width

    def apply(self, event: TaskEvent) -> None:
        if event.status is not None:
            self.status = event.status.value
        if (delta := event.delta) is not None:
            self.texts[delta.index] = delta.apply(self.texts.get(delta.index, ""))
            self.marks.setdefault(delta.index, _WRITING)
        if (sample := event.sample) is not None:
            self.finished += 1
            self.texts[sample.index] = sample.text or self.texts.get(sample.index, "")
            self.marks[sample.index] = _sample_mark(sample)
            if sample.status == SampleStatus.done and sample.answer is not None:
                self.votes[sample.answer] += 1
        if (preliminary := event.result) is not None:
            self.preliminary = preliminary
        if (task := event.task) is not None:
            self.planned = task.samples_planned

    def render(self) -> RenderableType:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column()
        grid.add_row("task", f"[bold]{self.task_id}[/bold] {self.status}")
        bar = ProgressBar(total=max(self.planned, 1), completed=self.finished, width=30)
        grid.add_row("samples", Columns([bar, f"{self.finished}/{self.planned}"]))
        tally = " · ".join(f"{a}: {n}" for a, n in self.votes.most_common(5)) or "none yet"
        grid.add_row("votes", tally)
        if self.preliminary is not None:
            grid.add_row(
                "preliminary",
                f"[bold]{self.preliminary.answer}[/bold] "
                f"(confidence {self.preliminary.confidence:.2f})",
            )
        room = max(20, self.width - 16)  # the label column and the padding
        for index in sorted(self.texts):
            mark = self.marks.get(index, _WRITING)
            line = Text(f"{mark} ", style="dim" if mark == _WRITING else "bold", no_wrap=True)
            line.append(_tail(self.texts[index], room - len(mark) - 1), style="default")
            grid.add_row(f"#{index}", line)
        return grid


_WRITING = "▸"


def _sample_mark(sample: Sample) -> str:
    """A finished sample's state in the live view: its answer, or why it has none."""
    if sample.status == SampleStatus.done:
        return f"= {sample.answer}" if sample.answer is not None else "= (no answer)"
    return sample.status.value


def _tail(text: str, width: int) -> str:
    """The end of ``text`` on one line of ``width`` characters (the end is what grows)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else "…" + flat[-(width - 1) :]


def _follow(client: Client, task: Task, timeout_s: float, *, live: bool) -> Task:
    """Wait for the task's end on its event stream, showing progress where it can."""
    if not (live and err_console.is_terminal):
        return client.wait(task.id, timeout=timeout_s)
    from rich.live import Live

    progress = TaskProgress(task, width=err_console.width)
    with Live(progress.render(), console=err_console, transient=True) as view:
        for event in client.events(task.id, timeout=timeout_s):
            progress.apply(event)
            view.update(progress.render(), refresh=True)
    return client.get(task.id)


# The request's own fields are checked by the SDK as the API checks them (one line, exit 2).
@app.command()
def submit(
    prompt: Annotated[str, typer.Argument(help="the prompt")],
    mode: Annotated[Mode, typer.Option(help=", ".join(Mode))] = DEFAULT_MODE,
    priority: Annotated[int, typer.Option(min=0, max=5, help="0 is the most urgent")] = 3,
    samples: Annotated[int | None, typer.Option(min=1, help="samples to run")] = None,
    task_type: Annotated[
        str, typer.Option(help=f"{', '.join(TaskType)}: how answers compare")
    ] = TaskType.auto,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(show_default=False, help="tokens per sample at most; default: the mode's"),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(show_default=False, help="sampling temperature, 0 to 2; default: the mode's"),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            show_default=False,
            help="the task's time limit in seconds, from its start (timeout_s); "
            "default: the mode's",
        ),
    ] = None,
    callback_url: Annotated[
        str | None,
        typer.Option(show_default=False, help="POST the task's webhooks here (signed)"),
    ] = None,
    target_confidence: Annotated[
        float | None,
        typer.Option(
            show_default=False,
            help="early stop once the leading answer stays the leader with this probability "
            "(auto mode: once the answer's calibrated confidence reaches it; 0 to 1); "
            "default: the mode's",
        ),
    ] = None,
    max_samples: Annotated[
        int | None,
        typer.Option(show_default=False, help="the budget: at most this many samples"),
    ] = None,
    max_total_tokens: Annotated[
        int | None,
        typer.Option(
            show_default=False,
            help="the budget: completion tokens over all samples; sampling stops when it is "
            "spent, with the best answer so far",
        ),
    ] = None,
    wait: Annotated[bool, typer.Option(help="follow the task live, then print the result")] = False,
    wait_timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds to follow the task with --wait")
    ] = 600,
    as_json: JsonOption = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Submit a task. Exit 0 on done/partial_done, 1 on failed/cancelled, 2 on usage errors."""
    with _service(url, api_key) as client:
        task = client.submit(
            prompt,
            mode=mode.value,
            priority=priority,
            samples=samples,
            task_type=task_type,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            timeout_s=timeout,
            callback_url=callback_url,
            target_confidence=target_confidence,
            max_samples=max_samples,
            max_total_tokens=max_total_tokens,
        )
        if wait:
            task = _follow(client, task, wait_timeout, live=not as_json)
    if as_json:
        _print_json(task.to_public())
    elif wait:
        _print_task(task)
    else:
        console.print(task.id)
    if wait and _exit_code(task.status) != EXIT_OK:
        raise typer.Exit(EXIT_TASK_FAILED)


def _event_line(event: TaskEvent) -> str:
    data = event.data
    if (sample := event.sample) is not None:
        detail = f"#{sample.index} {sample.status.value}"
        if sample.answer is not None:
            detail += f" answer={sample.answer}"
        if sample.error is not None:
            detail += f" ({sample.error.code}: {sample.error.message})"
    elif (delta := event.delta) is not None:
        detail = f"#{delta.index} @{delta.offset} {delta.text!r}"
    elif (result := event.result) is not None:
        detail = f"answer={result.answer} confidence={result.confidence:.2f}"
    elif event.event == EventName.result:
        answer = (data.get("result") or {}).get("answer")
        detail = f"{data.get('status')} answer={answer}" if answer is not None else data["status"]
    else:
        detail = str(data.get("status", data))
    return f"{event.id}  {event.event:<11} {detail}"


@app.command()
def events(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    last_event_id: Annotated[str | None, typer.Option(help="start after this event id")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to follow at most")] = 3600,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    deltas: Annotated[
        bool, typer.Option("--deltas", help="also the `delta` events (text as it is written)")
    ] = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Follow a task's events until it ends (exit code as for `submit --wait`)."""
    final: str | None = None
    with _service(url, api_key) as client:
        follow = client.events(task_id, last_event_id=last_event_id, timeout=timeout, deltas=deltas)
        for event in follow:
            if as_json:
                print(json.dumps({"id": event.id, "event": event.event, "data": event.data}))
            else:
                console.print(_event_line(event), highlight=False, markup=False, soft_wrap=True)
            if event.is_final and event.status is not None:
                final = event.status.value
        status = final or client.get(task_id).status.value  # none: it had already ended
    raise typer.Exit(_exit_code(status))


def _print_status(task: Task) -> None:
    console.print(f"{task.id} {task.status.value}")


def _print_answer(
    url: str,
    api_key: str | None,
    as_json: bool,
    call: Callable[[Client], Task],
    show: Callable[[Task], None],
) -> None:
    """Print the task that ``call`` gets from the service: as JSON, or as ``show`` does."""
    with _service(url, api_key) as client:
        task = call(client)
    if as_json:
        _print_json(task.to_public())
    else:
        show(task)


@app.command()
def get(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    as_json: JsonOption = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Show a task as it is now."""
    _print_answer(url, api_key, as_json, lambda client: client.get(task_id), _print_task)


@app.command()
def cancel(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    as_json: JsonOption = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Cancel a pending or running task (exit 1 if it already ended otherwise)."""
    _print_answer(url, api_key, as_json, lambda client: client.cancel(task_id), _print_status)


@app.command()
def wait(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait at most")] = 600,
    as_json: JsonOption = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """Wait for a task to end and show it, as the SDK's `Client.wait` (exit as `submit --wait`)."""
    with _service(url, api_key) as client:
        task = _follow(client, client.get(task_id), timeout, live=not as_json)
    if as_json:
        _print_json(task.to_public())
    else:
        _print_task(task)
    raise typer.Exit(_exit_code(task.status))


@app.command()
def tasks(
    status: Annotated[TaskStatus | None, typer.Option(help="only tasks in this status")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="tasks per page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="the next page (printed below)")] = None,
    as_json: JsonOption = False,
    url: UrlOption = _DEFAULT_URL,
    api_key: KeyOption = None,
) -> None:
    """List your tasks, newest first (also `ponder list`; the SDK's `Client.list`/`.tasks`)."""
    with _service(url, api_key) as client:
        page = client.list(status=status, limit=limit, cursor=cursor)
    if as_json:
        _print_json({"data": [t.to_public() for t in page.data], "next_cursor": page.next_cursor})
        return
    table = Table(
        Column("id", no_wrap=True), "status", "mode", Column("created", no_wrap=True),
        "samples", "answer", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for task in page.data:
        answer = task.result.answer if task.result is not None else None
        table.add_row(
            task.id,
            task.status.value,
            task.mode,
            task.created_at.strftime("%Y-%m-%d %H:%M"),
            f"{task.samples_done}/{task.samples_planned}",
            "" if answer is None else str(answer),
        )
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


app.command(
    "list",
    help="List your tasks, newest first: the same as `ponder tasks` (the SDK's `Client.list`).",
)(tasks)


@keys_app.command("new")
def keys_new() -> None:
    """Print a fresh API key and the digest to put in PONDER_API_KEYS."""
    from ponder.api.deps import key_digest

    key = "pk_" + secrets.token_urlsafe(32)
    console.print(f"key:    {key}")
    console.print(f"digest: {key_digest(key)}")
    console.print("Give the key to the client; add the digest to PONDER_API_KEYS.")


@keys_app.command("webhook-secret")
def keys_webhook_secret() -> None:
    """Print a fresh webhook signing secret (for PONDER_WEBHOOK_SECRET)."""
    from ponder.webhooks import generate_secret

    console.print(generate_secret(), highlight=False)


def main() -> None:
    with contextlib.suppress(KeyboardInterrupt):
        app()


if __name__ == "__main__":
    main()
