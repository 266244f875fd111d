"""The CLI as a user runs it: real subprocesses against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from ponder.config import Settings
from ponder.webhooks import generate_secret
from tests.conftest import LiveServer, until, wait_for_task
from tests.test_client import PERSON

pytestmark = pytest.mark.timeout(90)


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ponder.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_submit_wait_prints_the_result(sqlite_settings: Settings) -> None:
    async with LiveServer(sqlite_settings, workers=1) as live:
        code, out, _ = await run_cli(
            "submit", "What is 6*7? [[answers: 42, 42, 41]]", "--wait", "--url", live.url
        )
        assert code == 0, out
        assert "done" in out and "42" in out
        code, out, _ = await run_cli(
            "submit", "[[answers: 5]]", "--mode", "fast", "--wait", "--json", "--url", live.url
        )
        assert code == 0
        assert json.loads(out)["result"]["answer"] == "5"
        code, out, _ = await run_cli("submit", "[[fail]]", "--wait", "--url", live.url)
        assert code == 1
        assert "failed" in out
        code, out, _ = await run_cli("submit", "no wait [[answers: 1]]", "--url", live.url)
        assert code == 0 and out.strip().split("-")[1] == "test1"


async def test_usage_errors_exit_2() -> None:
    code, _, err = await run_cli("submit", "x", "--priority", "9")
    assert code == 2
    assert "priority" in err
    code, _, err = await run_cli("worker", env={"PONDER_REDIS_URL": ""})
    assert code == 2
    code, _, err = await run_cli("serve", env={"PONDER_MAX_PENDING": "-3"})
    assert code == 2 and "PONDER_MAX_PENDING" in err


@pytest.mark.parametrize(
    ("variable", "value"), [("PONDER_ENGINE", "nope"), ("PONDER_MODEL", "/nonexistent")]
)
async def test_serve_reports_an_engine_configuration_error_in_one_line(
    variable: str, value: str, tmp_path: Path
) -> None:
    """Found at start-up (the engine is made, the model looked for, in the app's lifespan):
    one line naming the variable, no traceback, exit 2."""
    env = {variable: value, "PONDER_PORT": "0", "PONDER_SQLITE_PATH": str(tmp_path / "p.db")}
    code, _, err = await run_cli("serve", env=env)
    assert code == 2, err
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert variable in line


def test_help_everywhere() -> None:
    """Every command's help (in-process: the entry point itself runs in test_version)."""
    from typer.testing import CliRunner

    from ponder.cli import app

    runner = CliRunner(env={"COLUMNS": "200"})
    commands = (
        [], ["serve"], ["api"], ["worker"], ["submit"], ["events"], ["get"], ["cancel"],
        ["wait"], ["tasks"], ["list"], ["keys", "new"], ["keys", "webhook-secret"],
    )  # fmt: skip
    out = {}
    for command in commands:
        result = runner.invoke(app, [*command, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, result.output
        out[" ".join(command)] = result.output
    assert "--processes" in out["api"]
    # the SDK's verbs and the CLI's share names; each help says which is which
    assert "ponder list" in out["tasks"] and "Client.list" in out["tasks"]
    assert "ponder tasks" in out["list"] and "Client.list" in out["list"]
    assert "Client.wait" in out["wait"]


async def test_version() -> None:
    from importlib.metadata import version

    code, out, _ = await run_cli("--version")
    assert code == 0 and out.strip() == f"ponder {version('ponder')}"


async def test_submit_sets_the_request_fields(sqlite_settings: Settings) -> None:
    """Each flag of `submit` becomes its field of the request (`--timeout`: timeout_s)."""
    hooks = sqlite_settings.model_copy(
        update={"webhook_secret": SecretStr(generate_secret()), "callback_allow_private": True}
    )
    async with LiveServer(hooks, workers=1) as live:
        code, out, err = await run_cli(
            "submit", "What is 2+2? [[answers: 4]]", "--max-new-tokens", "7",
            "--temperature", "0.25", "--task-type", "math", "--timeout", "30",
            "--target-confidence", "0.9", "--callback-url", f"{live.url}/hook",
            "--wait", "--wait-timeout", "20", "--json", "--url", live.url,
        )  # fmt: skip
        assert code == 0, err
        task = json.loads(out)
        assert task["status"] == "done"
        assert (task["max_new_tokens"], task["temperature"], task["task_type"]) == (7, 0.25, "math")
        assert (task["timeout_s"], task["target_confidence"]) == (30, 0.9)
        assert task["callback"]["url"] == f"{live.url}/hook"
        # `ponder wait` shows an ended task at once, with submit --wait's exit code
        code, out, _ = await run_cli("wait", task["id"], "--json", "--url", live.url)
        assert code == 0 and json.loads(out)["id"] == task["id"]
        # auto mode and the budget; the result says where the cascade ended
        code, out, err = await run_cli(
            "submit", "What is 2+2? [[answers: 4, 5, 4]]", "--mode", "auto",
            "--max-samples", "2", "--max-total-tokens", "99", "--target-confidence", "1",
            "--wait", "--wait-timeout", "20", "--url", live.url,
        )  # fmt: skip
        assert code == 0, err
        assert "· auto ·" in out and "stage 2 of 3 · stopped: budget" in out


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--max-new-tokens", "0", "max_new_tokens"),
        ("--temperature", "2.5", "temperature"),
        ("--task-type", "poetry", "task_type"),
        ("--timeout", "-1", "timeout_s"),
        ("--target-confidence", "1.5", "target_confidence"),
        ("--callback-url", "not a url", "callback_url"),
        ("--max-samples", "0", "max_samples"),
        ("--max-total-tokens", "0", "max_total_tokens"),
    ],
)
async def test_a_bad_submit_flag_is_one_line_and_sends_nothing(
    flag: str, value: str, field: str
) -> None:
    # nothing listens at this URL: the SDK refuses the request before sending it
    code, out, err = await run_cli("submit", "x", flag, value, "--url", "http://127.0.0.1:9")
    assert code == 2 and out == ""
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith(f"error 422 invalid: {field}: "), line


async def test_submit_a_schema_prints_the_object_and_each_field(
    sqlite_settings: Settings, tmp_path: Path
) -> None:
    schema = tmp_path / "person card.json"
    schema.write_text(json.dumps(PERSON))
    async with LiveServer(sqlite_settings, workers=1) as live:
        code, out, err = await run_cli(
            "submit", "Who?", "--schema", str(schema), "--wait", "--json", "--url", live.url
        )
        assert code == 0, err
        task = json.loads(out)
        assert task["response_format"]["json_schema"]["name"] == "person_card"
        assert task["response_format"]["json_schema"]["strict"] is True
        assert task["response_format"]["json_schema"]["schema"] == PERSON
        code, out, err = await run_cli("get", task["id"], "--url", live.url)
        assert code == 0, err
    answer = task["result"]["object"]
    assert json.dumps(answer, indent=2, ensure_ascii=False) in out
    for field, vote in task["result"]["fields"].items():
        row = re.search(rf"^{re.escape(field)}\s+(.+?)\s+([0-9.]+)\s+([0-9.]+)\s*$", out, re.M)
        assert row is not None, out
        assert (json.loads(row[1]), row[2]) == (vote["value"], f"{vote['confidence']:.2f}")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "--schema: cannot read"),
        ("{not json", "is not a JSON file"),
        (
            json.dumps({"type": "object", "properties": {"a": {"anyOf": []}}}),
            "error 422 invalid: response_format.json_schema.schema: properties.a.anyOf",
        ),
        (json.dumps([1, 2]), "response_format.json_schema.schema: Input should be a valid dict"),
        (json.dumps({"type": "string"}), "the schema's root must be"),
    ],
)
async def test_a_bad_schema_file_is_one_line_and_sends_nothing(
    tmp_path: Path, content: str | None, fragment: str
) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    # nothing listens at this URL: the file is refused before anything is sent
    code, out, err = await run_cli(
        "submit", "x", "--schema", str(path), "--url", "http://127.0.0.1:9"
    )
    assert code == 2 and out == ""
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert fragment in line, line


async def test_tasks_and_list_are_one_command(sqlite_settings: Settings) -> None:
    async with LiveServer(sqlite_settings, workers=0) as live:
        code, out, _ = await run_cli("submit", "[[answers: 1]]", "--url", live.url)
        assert code == 0
        listed = [
            (await run_cli(verb, "--json", "--url", live.url))[1] for verb in ("tasks", "list")
        ]
        assert listed[0] == listed[1] and out.strip() in listed[0]


@pytest.mark.parametrize("command", ["serve", "api"])
async def test_a_port_in_use_fails_before_the_model_loads(
    command: str, tmp_path: Path, redis_url: str
) -> None:
    """One line naming --port and PONDER_PORT, exit 2, no traceback, and before the engine is
    made: a model that does not exist would be the error otherwise."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        env = {
            "PONDER_MODEL": "/nonexistent",
            "PONDER_SQLITE_PATH": str(tmp_path / "p.db"),
            "PONDER_REDIS_URL": redis_url,
        }
        code, _, err = await run_cli(command, env={**env, "PONDER_PORT": str(port)})
        code_flag, _, err_flag = await run_cli(
            command, "--port", str(port), env={**env, "PONDER_PORT": "0"}
        )
    assert code == code_flag == 2, err
    assert err_flag == err and "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith(f"error: cannot listen on 127.0.0.1:{port} (Address already in use)")
    assert "--port" in line and "PONDER_PORT" in line


async def test_keys_new_prints_key_and_digest() -> None:
    import hashlib

    code, out, _ = await run_cli("keys", "new")
    assert code == 0
    lines = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    key, digest = lines["key"].strip(), lines["digest"].strip()
    assert hashlib.sha256(key.encode()).hexdigest() == digest


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


async def test_submit_wait_shows_live_progress(sqlite_settings: Settings) -> None:
    async with LiveServer(sqlite_settings, workers=1) as live:
        tty = {"TTY_COMPATIBLE": "1", "COLUMNS": "100", "LINES": "30", "NO_COLOR": "1"}
        code, out, err = await run_cli(
            "submit", "What is 2+3? [[answers: 5, 5, 4, 5, 5]] [[sleep_ms: 40]]",
            "--mode", "deep", "--wait", "--url", live.url, env=tty,
        )  # fmt: skip
        assert code == 0, err
        out, err = strip_ansi(out), strip_ansi(err)
        # the live view (on stderr): samples done/planned, the tally, the early answer
        assert "samples" in err and "/5" in err and "votes" in err and "preliminary" in err
        # the result (on stdout) with its vote table
        assert "done" in out and "answer: 5" in out
        assert "votes" in out and "answer" in out


async def test_follow_cancel_and_list(sqlite_settings: Settings) -> None:
    async with LiveServer(sqlite_settings, workers=1) as live:
        code, out, _ = await run_cli("submit", "[[hang]]", "--url", live.url)
        assert code == 0
        task_id = out.strip()
        follower = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ponder.cli", "events", task_id, "--url", live.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert follower.stdout is not None
        lines = []
        async with asyncio.timeout(30):
            while "running" not in (line := (await follower.stdout.readline()).decode()):
                lines.append(line)
        code, out, _ = await run_cli("cancel", task_id, "--url", live.url)
        assert code == 0 and out.split() == [task_id, "cancelled"]
        rest, _ = await asyncio.wait_for(follower.communicate(), 30)
        assert follower.returncode == 1  # the task ended cancelled
        assert rest.decode().split()[-2:] == ["status", "cancelled"]
        # a task that already ended: 409
        code, _, err = await run_cli("cancel", task_id, "--url", live.url)
        assert code == 0  # cancelling a cancelled task is fine
        code, out, _ = await run_cli(
            "submit", "[[answers: 3]]", "--mode", "fast", "--wait", "--json", "--url", live.url
        )
        done_id = json.loads(out)["id"]
        code, _, err = await run_cli("cancel", done_id, "--url", live.url)
        assert code == 1 and "conflict" in err
        # events of a finished task: replayed, exit 0
        code, out, _ = await run_cli("events", done_id, "--json", "--url", live.url)
        assert code == 0
        events = [json.loads(line) for line in out.splitlines()]
        assert [e["event"] for e in events][:2] == ["status", "status"]
        assert events[-1]["event"] == "result" and events[-1]["data"]["status"] == "done"
        code, out, _ = await run_cli(
            "events", done_id, "--last-event-id", events[-1]["id"], "--url", live.url
        )
        assert code == 0 and out == ""
        code, out, _ = await run_cli("tasks", "--json", "--url", live.url)
        assert code == 0
        listed = json.loads(out)
        assert [t["id"] for t in listed["data"]] == [done_id, task_id]
        code, out, _ = await run_cli("tasks", "--status", "done", "--url", live.url)
        assert code == 0 and done_id in out and task_id not in out
        code, out, _ = await run_cli("get", done_id, "--url", live.url)
        assert code == 0 and "answer: 3" in out
        code, _, err = await run_cli("get", "1764412800123-nope-1", "--url", live.url)
        assert code == 1 and "not_found" in err


async def test_remote_service_with_an_api_key(sqlite_settings: Settings) -> None:
    from ponder.api.deps import key_digest

    secured = sqlite_settings.model_copy(update={"api_keys": [key_digest("pk_cli")]})
    async with LiveServer(secured, workers=1) as live:
        code, _, err = await run_cli("tasks", "--url", live.url, env={"PONDER_API_KEY": ""})
        assert code == 1 and "unauthorized" in err
        env = {"PONDER_API_KEY": "pk_cli", "PONDER_URL": live.url}
        code, out, err = await run_cli("submit", "[[answers: 9]]", "--wait", "--json", env=env)
        assert code == 0, err
        assert json.loads(out)["result"]["answer"] == "9"
        code, out, _ = await run_cli("tasks", env=env)
        assert code == 0 and "done" in out


async def test_unreachable_service_exits_1() -> None:
    code, _, err = await run_cli("tasks", "--url", "http://127.0.0.1:9")
    assert code == 1 and "cannot reach" in err


async def test_keys_webhook_secret() -> None:
    from ponder.config import load_settings

    code, out, _ = await run_cli("keys", "webhook-secret")
    assert code == 0 and out.startswith("whsec_")
    assert load_settings(webhook_secret=out.strip()).webhook_secret is not None


def test_progress_view() -> None:
    from rich.console import Console

    from ponder.cli import TaskProgress
    from ponder.client import TaskEvent
    from ponder.types import Task

    progress = TaskProgress(Task(id="1764412800123-api1-1", samples_planned=4))
    sample = {"index": 0, "temperature": 0.5, "seed": 1, "status": "done", "answer": "408"}
    for event in (
        TaskEvent("1", "status", {"status": "running"}),
        TaskEvent("2", "sample", sample),
        TaskEvent("3", "sample", {**sample, "index": 1, "answer": "418"}),
        TaskEvent("4", "sample", {**sample, "index": 2}),
        TaskEvent("5", "preliminary", {"answer": "408", "text": "t", "confidence": 0.8,
                                       "agreement": 1.0, "votes": {"408": 1}, "chosen_sample": 0}),
    ):  # fmt: skip
        progress.apply(event)
    screen = Console(record=True, width=100, color_system=None)
    screen.print(progress.render())
    text = screen.export_text()
    assert "running" in text and "3/4" in text
    assert "408: 2 · 418: 1" in text
    assert "preliminary" in text and "0.80" in text
    assert "running" in text and "· ponder" not in text  # the one model of no models file


def test_progress_view_of_an_expired_task() -> None:
    from rich.console import Console

    from ponder.cli import TaskProgress
    from ponder.client import TaskEvent
    from ponder.types import Task

    progress = TaskProgress(Task(id="1764412800123-api1-1", model="big", queue_timeout_s=2))
    progress.apply(TaskEvent("1", "status", {"status": "expired"}))
    screen = Console(record=True, width=100, color_system=None)
    screen.print(progress.render())
    text = screen.export_text()
    assert "expired · big" in text and "it never ran" in text


MODELS = """
[models.small]
engine = "scripted"

[models.big]
engine = "scripted"
"""


async def test_submit_and_list_by_model(tmp_path: Path) -> None:
    """`--model` and `--queue-timeout` become the request's fields; the answer and the
    list name the model; an unknown model is one line, exit 2, and creates nothing."""
    from tests.conftest import make_settings

    (tmp_path / "models.toml").write_text(MODELS)
    settings = make_settings(
        sqlite_path=str(tmp_path / "ponder.db"), models_file=str(tmp_path / "models.toml")
    )
    async with LiveServer(settings, workers=1) as live:
        code, out, err = await run_cli(
            "submit", "What is 2+2? [[answers: 4]]", "--model", "big-fast",
            "--queue-timeout", "30", "--wait", "--wait-timeout", "20", "--url", live.url,
        )  # fmt: skip
        assert code == 0, err
        assert "done · big · fast ·" in out
        code, out, err = await run_cli("submit", "x", "--model", "huge", "--url", live.url)
        assert code == 2 and out == ""
        (line,) = err.splitlines()
        assert line.startswith("error 404 model_not_found: model: the model `huge`"), line
        code, out, err = await run_cli("tasks", "--json", "--url", live.url)
        assert code == 0, err
        (task,) = json.loads(out)["data"]
        assert (task["model"], task["mode"], task["queue_timeout_s"]) == ("big", "fast", 30)
        code, out, _ = await run_cli("tasks", "--url", live.url)
        assert code == 0 and re.search(r"done\s+big\s+fast", out), out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_serve_stops_without_leaking_semaphores(sig: signal.Signals, tmp_path: Path) -> None:
    """`ponder serve`, stopped by a signal after math-verify ran (its process pool holds
    semaphores): nothing is left to the resource tracker, which would warn of "leaked
    semaphore objects" (uvicorn re-raises SIGTERM after its graceful shutdown: ponder ends
    on it with code 0, its atexit handlers run)."""
    env = {**os.environ, "PONDER_ENGINE": "scripted", "PONDER_PORT": "0",
           "PONDER_SQLITE_PATH": str(tmp_path / "p.db")}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ponder.cli", "serve",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        line = b""
        async with asyncio.timeout(30):  # the first lines name the port it listens on
            while not (found := re.search(rb"ponder on (http://\S+)", line)):
                line = await proc.stderr.readline()
                assert line, "serve ended during its start"
        async with httpx.AsyncClient(base_url=found[1].decode(), timeout=30) as c:

            async def ready() -> bool:
                return (await c.get("/readyz")).status_code == 200

            await until(ready, 30, "the service to be ready")
            body = {
                "prompt": "Simplify: [[answers: \\sqrt{2}, 2^{1/2}, \\sqrt{2}]]",
                "task_type": "math",
            }
            task_id = (await c.post("/v1/tasks", json=body)).json()["id"]
            done = await wait_for_task(c, task_id, timeout_s=60)
        result: Any = done["result"]
        assert len(result["votes"]) == 1, result  # math-verify found the forms equal
        proc.send_signal(sig)
        _, rest = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = rest.decode()
    assert "leaked semaphore" not in err and "Traceback" not in err, err
    assert proc.returncode == 0  # Ctrl+C and SIGTERM alike: a shutdown asked for
