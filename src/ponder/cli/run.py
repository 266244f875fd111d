"""The commands that run the service: ``serve`` (API and workers in one process), ``api``
(the API alone, in one or more processes) and ``worker``; the listening socket, uvicorn,
the signals, the metrics server of a worker process."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer
import uvloop

from ponder.cli.base import err_console, fail, settings_and_logging
from ponder.config import Settings
from ponder.engines import describe_engine
from ponder.errors import ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["api", "run_worker", "serve", "worker"]


def _listen(settings: Settings) -> socket.socket:
    """The server's socket, bound and listening before anything else starts (a model
    takes seconds to load; a port in use is known at once)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    try:
        return socket.create_server((settings.host, settings.port), family=family, backlog=2048)
    except OSError as e:
        why = (e.strerror or str(e)).split(" (while attempting", 1)[0]  # create_server's addition
        raise fail(
            f"cannot listen on {settings.host}:{settings.port} ({why}): give a free port with "
            "--port or PONDER_PORT (and an address of this machine with --host or PONDER_HOST)"
        ) from None


def _serve_http(settings: Settings, workers: int, processes: int = 1) -> None:
    """Serve the API on the listening socket: in this process (with ``workers`` worker
    loops, as ``ponder serve``), or in ``processes`` API processes sharing it (uvicorn's
    supervisor: each imports ``create_app_from_environment``; a child that dies is
    replaced)."""
    listener = _listen(settings)
    url = _announce(settings, listener, workers)
    log_level, grace = settings.log_level.lower(), int(settings.shutdown_grace_s) + 1
    if processes > 1:
        _serve_processes(listener, processes, url, log_level, grace)
    else:
        _serve_here(listener, _application(settings, workers), url, log_level, grace)


def _announce(settings: Settings, listener: socket.socket, workers: int) -> str:
    """Say where the service listens, on what store and engine (and that auth is off
    where it is); the service's URL."""
    from ponder.store import create_store

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
        f"{_engines(settings) if workers else 'engine: (none: api only)'}"
    )
    return f"http://{host}:{port}"


def _engines(settings: Settings) -> str:
    """The engine in a few words; with a models file, each model's."""
    if not settings.models_file:
        return f"engine: {describe_engine(settings)}"
    return "models: " + ", ".join(
        f"{name} ({spec.engine}{f' {spec.model}' if spec.model else ''})"
        for name, spec in settings.models.items()
    )


def _application(settings: Settings, workers: int) -> FastAPI:
    """``ponder serve``'s API and worker runtime, or with no workers the API alone."""
    if not workers:
        from ponder.api import create_app

        return create_app(settings)
    from ponder.compose import all_in_one

    try:
        return all_in_one(settings, workers=workers).app
    except ConfigError as e:
        raise fail(str(e)) from None


def _serve_here(
    listener: socket.socket, application: FastAPI, url: str, log_level: str, grace: int
) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            # uvicorn says this only of sockets it binds itself
            logging.getLogger("uvicorn.error").info(
                "Uvicorn running on %s (Press CTRL+C to quit)", url
            )

    config = uvicorn.Config(application, log_level=log_level, timeout_graceful_shutdown=grace)
    # uvicorn re-raises the signal it stopped on once it has shut down (as uvicorn.run):
    # SIGINT as KeyboardInterrupt, SIGTERM through this handler, so both end with code 0
    signal.signal(signal.SIGTERM, _terminated)
    try:
        with listener:
            Server(config).run(sockets=[listener])
    except (KeyboardInterrupt, _Terminated):
        pass
    except SystemExit:  # uvicorn's exit when the start-up failed
        error = getattr(application.state, "startup_error", None)
        if error is None:
            raise
        raise fail(str(error)) from None


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
        raise fail("an API process failed to start (its log is above)", 1)


def serve(
    host: Annotated[str | None, typer.Option(help="bind address [PONDER_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port [PONDER_PORT]")] = None,
    workers: Annotated[int, typer.Option(min=1, help="worker loops in this process")] = 1,
) -> None:
    """All in one process: the API plus workers (embedded SQLite unless PONDER_REDIS_URL).

    Engine: PONDER_ENGINE, by default `openvino` (OpenVINO GenAI, continuous batching).

    It runs PONDER_MODEL (default: the packaged SmolLM2-135M) in an engine process of its own.

    With PONDER_MODELS_FILE it serves every model of the file: a local model loads on its
    first task and unloads after its keep_alive_s idle, at most PONDER_MAX_LOADED_MODELS
    at once (docs/models.md).

    Threads: PONDER_ENGINE_THREADS; rows at once: PONDER_ENGINE_MAX_ROWS.

    The first start writes the model's weights into PONDER_MODEL_CACHE_DIR (seconds).
    """
    _serve_http(settings_and_logging(host=host, port=port), workers)


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
    settings = settings_and_logging(host=host, port=port)
    if not settings.redis_url:
        raise fail(
            "`ponder api` needs PONDER_REDIS_URL (workers must share the store); use "
            "`ponder serve` for one process"
        )
    _serve_http(settings, workers=0, processes=processes)


def worker(
    workers: Annotated[
        int, typer.Option(min=1, help="worker loops in this process, per served model")
    ] = 1,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            show_default=False,
            help="serve only these models of PONDER_MODELS_FILE, comma-separated (a,b) "
            "(default: every model of the file)",
        ),
    ] = None,
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
    """A worker process: claims its models' tasks from Redis and runs them on their engines.

    It serves the models of PONDER_MODELS_FILE (or --models): each model's tasks go to its
    own engine, which loads on the model's first task and unloads after its keep_alive_s
    idle (at most PONDER_MAX_LOADED_MODELS local models at once). Without the file: the
    one model of PONDER_ENGINE / PONDER_MODEL, loaded at start.

    Waits for Redis at start-up (one line per attempt) and rides out Redis outages.
    """
    settings = settings_and_logging(metrics_port=metrics_port)
    if not settings.redis_url:
        raise fail(
            "`ponder worker` needs PONDER_REDIS_URL; use `ponder serve` for the embedded store"
        )
    names = _model_names(settings, models)
    try:
        uvloop.run(run_worker(settings, workers, names))  # as uvicorn runs the API's loop
    except ConfigError as e:
        raise fail(str(e)) from e


def _model_names(settings: Settings, option: str | None) -> list[str] | None:
    """``--models a,b`` as names, each a configured model (one error line naming the
    configured ones otherwise); None: every model."""
    if option is None:
        return None
    from ponder.runtime import served_models

    names = [name.strip() for name in option.split(",") if name.strip()]
    if not names:
        raise fail(f"--models: give model names, comma-separated ({', '.join(settings.models)})")
    try:
        served_models(settings, names)
    except ConfigError as e:
        raise fail(str(e)) from None
    return names


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


async def run_worker(settings: Settings, workers: int, models: list[str] | None = None) -> None:
    """``ponder worker``: ``workers`` loops for each of ``models`` (None: every model)."""
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
        runtime = WorkerRuntime(settings, store, workers=workers, models=models)
        await runtime.start()
        err_console.print(
            f"worker {settings.node_id} running ({workers} loop(s)) for model(s) "
            + ", ".join(runtime.runners)
        )
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
