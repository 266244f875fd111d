"""The commands that use a running service through the SDK: ``submit``, ``events``,
``get``, ``cancel``, ``wait``, ``tasks`` (``list``)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Column, Table
from rich.text import Text

from ponder.cli.base import (
    EXIT_OK,
    EXIT_TASK_FAILED,
    EXIT_USAGE,
    console,
    err_console,
    exit_code,
    fail,
    print_json,
)
from ponder.cli.progress import follow
from ponder.client_core import DEFAULT_URL
from ponder.config.models import DEFAULT_MODEL
from ponder.errors import ConfigError
from ponder.types import EventName, Mode, Result, Task, TaskStatus, TaskType

if TYPE_CHECKING:
    from ponder.client import Client, TaskEvent

__all__ = ["cancel", "events", "get", "submit", "tasks", "wait"]


# Without --url and --api-key the SDK reads PONDER_URL and PONDER_API_KEY (ponder.config).
UrlOption = Annotated[
    str | None,
    typer.Option("--url", show_default=False, help=f"service URL [PONDER_URL, else {DEFAULT_URL}]"),
]
KeyOption = Annotated[
    str | None,
    typer.Option("--api-key", show_default=False, help="API key [PONDER_API_KEY]"),
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]


@contextlib.contextmanager
def _service(url: str | None, api_key: str | None) -> Iterator[Client]:
    """An SDK client; its errors become a message on stderr and an exit code."""
    from ponder.client import APIConnectionError, APIError, Client, WaitTimeout

    client: Client | None = None
    try:
        with Client(url, api_key=api_key or None) as client:
            yield client
    except APIError as e:
        err_console.print(f"[red]error {e.status_code}[/red] {e.code}: {e.message}")
        usage = e.status_code in (400, 413, 422) or e.code == "model_not_found"
        raise typer.Exit(EXIT_USAGE if usage else EXIT_TASK_FAILED) from e
    except APIConnectionError as e:
        where = client.base_url if client is not None else url
        raise fail(f"cannot reach {where}: {e}", EXIT_TASK_FAILED) from e
    except WaitTimeout as e:
        err_console.print(f"[red]timed out[/red]: {e}; the task goes on")
        raise typer.Exit(EXIT_TASK_FAILED) from e
    except ConfigError as e:  # a malformed PONDER_URL / PONDER_API_KEY
        raise fail(str(e)) from e


def _vote_table(votes: dict[str, int], title: str | None = None) -> Table:
    table = Table("answer", "votes", title=title, title_justify="left", box=None)
    for answer, count in sorted(votes.items(), key=lambda kv: -kv[1]):
        table.add_row(answer, str(count))
    return table


def _print_object(result: Result) -> None:
    """A structured result: the object as indented JSON, then each field's vote."""
    console.print("answer:")
    console.print_json(data=result.object)
    table = Table("field", "value", "confidence", "agreement", box=None, pad_edge=False)
    for path, vote in (result.fields or {}).items():
        value = Text(json.dumps(vote.value, ensure_ascii=False))  # no markup in a value
        table.add_row(Text(path), value, f"{vote.confidence:.2f}", f"{vote.agreement:.2f}")
    console.print(table)
    if result.object_from == "sample":
        console.print("(the fields' winners did not validate together: the best whole sample)")


#: a status's color (any other: red); ``expired``: it waited past its queue_timeout_s
_COLORS = {
    "done": "green",
    "partial_done": "yellow",
    "running": "cyan",
    "pending": "cyan",
    "expired": "magenta",
}


def _model_part(task: Task) -> str:
    """``"NAME · "`` for a task's model, "" for ``ponder`` (a service without a models
    file: its one model)."""
    return "" if task.model == DEFAULT_MODEL else f"{task.model} · "


def _print_task(task: Task) -> None:
    status = task.status.value
    tint = _COLORS.get(status, "red")
    console.print(
        f"[bold]{task.id}[/bold] [{tint}]{status}[/{tint}] · {_model_part(task)}{task.mode} · "
        f"{task.samples_done}/{task.samples_planned} samples"
    )
    result = task.result
    if result is not None:
        if result.object is not None:  # a structured task (response_format)
            _print_object(result)
        else:
            console.print(f"answer: [bold]{result.answer}[/bold]")
        facts = [f"confidence {result.confidence:.2f}", f"agreement {result.agreement:.2f}"]
        if result.stage is not None:  # auto mode: where the cascade ended
            facts.append(f"stage {result.stage} of 3")
        if result.stop_reason is not None:
            facts.append(f"stopped: {result.stop_reason}")
        console.print(" · ".join(facts))
        if result.votes and result.object is None:
            console.print(_vote_table(result.votes))
        if result.clarification:
            console.print(f"[yellow]clarification:[/yellow] {result.clarification}")
        if result.object is None:
            console.print(result.text)
    elif task.preliminary is not None:
        console.print(f"preliminary answer: [bold]{task.preliminary.answer}[/bold]")
    if task.error is not None:
        console.print(f"error: {task.error.code}: {task.error.message}")


#: the help of `ponder submit`'s options
_HELP = {
    "task_type": f"{', '.join(TaskType)}: how answers compare",
    "max_new_tokens": "tokens per sample at most; default: the mode's",
    "temperature": "sampling temperature, 0 to 2; default: the mode's",
    "timeout": "the task's time limit in seconds, from its start (timeout_s); default: the mode's",
    "model": "the model that answers: a name GET /v1/models lists (NAME, NAME-<mode>, an "
    "alias); default: the service's default model",
    "mode": f"{', '.join(Mode)}; default: the mode the model name selects, else standard",
    "queue_timeout": "seconds the task may wait for a worker; not started by then, it ends "
    "expired and never runs (queue_timeout_s); default: its model's",
    "callback_url": "POST the task's webhooks here (signed)",
    "target_confidence": "early stop once the leading answer stays the leader with this "
    "probability (auto mode: once the answer's calibrated confidence reaches it; 0 to 1); "
    "default: the mode's",
    "max_samples": "the budget: at most this many samples",
    "max_total_tokens": "the budget: completion tokens over all samples; sampling stops when "
    "it is spent, with the best answer so far",
    "schema": "ask for a structured answer: a JSON file holding a JSON Schema (the object "
    "the answer must be; named after the file, decoding constrained where the engine can)",
    "wait": "follow the task live, then print the result",
    "wait_timeout": "seconds to follow the task with --wait",
}


def _unless_given(help_text: str) -> Any:
    """An option left out of the request unless given (the mode's default applies)."""
    return typer.Option(show_default=False, help=help_text)


def _response_format(path: Path) -> dict[str, Any]:
    """``--schema FILE``: the ``response_format`` of the JSON Schema in ``path`` (named after
    the file, strict); a file that cannot be read or is not JSON is one line, exit 2. The
    schema itself is checked by the SDK as the API checks it."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise fail(f"--schema: cannot read {path}: {e.strerror or e}") from e
    except (UnicodeDecodeError, ValueError) as e:
        raise fail(f"--schema: {path} is not a JSON file: {e}") from e
    name = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem)[:64] or "schema"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


# The request's own fields are checked by the SDK as the API checks them (one line, exit 2).
def submit(
    prompt: Annotated[str, typer.Argument(help="the prompt")],
    model: Annotated[str | None, _unless_given(_HELP["model"])] = None,
    mode: Annotated[Mode | None, _unless_given(_HELP["mode"])] = None,
    priority: Annotated[int, typer.Option(min=0, max=5, help="0 is the most urgent")] = 3,
    samples: Annotated[int | None, typer.Option(min=1, help="samples to run")] = None,
    task_type: Annotated[str, typer.Option(help=_HELP["task_type"])] = TaskType.auto,
    max_new_tokens: Annotated[int | None, _unless_given(_HELP["max_new_tokens"])] = None,
    temperature: Annotated[float | None, _unless_given(_HELP["temperature"])] = None,
    timeout: Annotated[float | None, _unless_given(_HELP["timeout"])] = None,
    queue_timeout: Annotated[float | None, _unless_given(_HELP["queue_timeout"])] = None,
    callback_url: Annotated[str | None, _unless_given(_HELP["callback_url"])] = None,
    target_confidence: Annotated[float | None, _unless_given(_HELP["target_confidence"])] = None,
    max_samples: Annotated[int | None, _unless_given(_HELP["max_samples"])] = None,
    max_total_tokens: Annotated[int | None, _unless_given(_HELP["max_total_tokens"])] = None,
    schema: Annotated[Path | None, _unless_given(_HELP["schema"])] = None,
    wait: Annotated[bool, typer.Option(help=_HELP["wait"])] = False,
    wait_timeout: Annotated[float, typer.Option(min=0.1, help=_HELP["wait_timeout"])] = 600,
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Submit a task. Exit 0 on done/partial_done, 1 on failed/cancelled/expired, 2 on usage
    errors."""
    with _service(url, api_key) as client:
        task = client.submit(
            prompt,
            model=model,
            mode=mode.value if mode is not None else None,
            priority=priority,
            samples=samples,
            task_type=task_type,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            timeout_s=timeout,
            queue_timeout_s=queue_timeout,
            callback_url=callback_url,
            target_confidence=target_confidence,
            max_samples=max_samples,
            max_total_tokens=max_total_tokens,
            response_format=_response_format(schema) if schema is not None else None,
        )
        if wait:
            task = follow(client, task, wait_timeout, live=not as_json)
    if as_json:
        print_json(task.to_public())
    elif wait:
        _print_task(task)
    else:
        console.print(task.id)
    if wait and exit_code(task.status) != EXIT_OK:
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


def events(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    last_event_id: Annotated[str | None, typer.Option(help="start after this event id")] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to follow at most")] = 3600,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    deltas: Annotated[
        bool, typer.Option("--deltas", help="also the `delta` events (text as it is written)")
    ] = False,
    url: UrlOption = None,
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
    raise typer.Exit(exit_code(status))


def _print_status(task: Task) -> None:
    console.print(f"{task.id} {task.status.value}")


def _print_answer(
    url: str | None,
    api_key: str | None,
    as_json: bool,
    call: Callable[[Client], Task],
    show: Callable[[Task], None],
) -> None:
    """Print the task that ``call`` gets from the service: as JSON, or as ``show`` does."""
    with _service(url, api_key) as client:
        task = call(client)
    if as_json:
        print_json(task.to_public())
    else:
        show(task)


def get(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Show a task as it is now."""
    _print_answer(url, api_key, as_json, lambda client: client.get(task_id), _print_task)


def cancel(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Cancel a pending or running task (exit 1 if it already ended otherwise)."""
    _print_answer(url, api_key, as_json, lambda client: client.cancel(task_id), _print_status)


def wait(
    task_id: Annotated[str, typer.Argument(help="the task id")],
    timeout: Annotated[float, typer.Option(min=0.1, help="seconds to wait at most")] = 600,
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Wait for a task to end and show it, as the SDK's `Client.wait` (exit as `submit --wait`)."""
    with _service(url, api_key) as client:
        task = follow(client, client.get(task_id), timeout, live=not as_json)
    if as_json:
        print_json(task.to_public())
    else:
        _print_task(task)
    raise typer.Exit(exit_code(task.status))


def tasks(
    status: Annotated[TaskStatus | None, typer.Option(help="only tasks in this status")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100, help="tasks per page")] = 20,
    cursor: Annotated[str | None, typer.Option(help="the next page (printed below)")] = None,
    as_json: JsonOption = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """List your tasks, newest first (also `ponder list`; the SDK's `Client.list`/`.tasks`)."""
    with _service(url, api_key) as client:
        page = client.list(status=status, limit=limit, cursor=cursor)
    if as_json:
        print_json({"data": [t.to_public() for t in page.data], "next_cursor": page.next_cursor})
        return
    console.print(_task_table(page.data))
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}")


def _task_table(listed: list[Task]) -> Table:
    """A page of tasks, one row each; the model column unless every task is on ``ponder``
    (a service without a models file: its one model)."""
    models = any(task.model != DEFAULT_MODEL for task in listed)
    table = Table(
        Column("id", no_wrap=True), "status", *(["model"] if models else []), "mode",
        Column("created", no_wrap=True), "samples", "answer",
        box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for task in listed:
        answer = task.result.answer if task.result is not None else None
        table.add_row(
            task.id,
            Text(task.status.value, style=_COLORS.get(task.status.value, "red")),
            *([task.model] if models else []),
            task.mode,
            task.created_at.strftime("%Y-%m-%d %H:%M"),
            f"{task.samples_done}/{task.samples_planned}",
            "" if answer is None else str(answer),
        )
    return table


COMMANDS = (submit, events, get, cancel, wait, tasks)
