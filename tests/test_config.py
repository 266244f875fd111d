from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ponder.config import CROSS_FIELD_CHECKS, load_settings
from ponder.errors import ConfigError
from ponder.types import Mode


def test_defaults_match_the_mode_table() -> None:
    s = load_settings()
    assert (s.mode(Mode.fast).samples, s.mode(Mode.fast).temperature) == (1, 0.3)
    assert s.mode("standard").samples == 3
    assert s.mode("standard").max_new_tokens == 1024
    assert s.mode("deep").samples == 5
    assert s.mode("deep").sample_timeout_s == 90
    assert s.mode("deep").task_timeout_s == 420
    assert s.max_pending == 500


def test_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PONDER_MAX_PENDING", "7")
    monkeypatch.setenv("PONDER_PRIORITY_QUOTAS", "5,4,3,2,1,1")
    monkeypatch.setenv("PONDER_SCRIPTED_STEP_MS", "200,6.7")
    monkeypatch.setenv("PONDER_MODES__STANDARD__SAMPLES", "5")
    s = load_settings()
    assert s.max_pending == 7
    assert s.priority_quotas == [5, 4, 3, 2, 1, 1]
    assert s.scripted_step_ms == [200.0, 6.7]
    assert s.mode("standard").samples == 5
    assert s.mode("fast").samples == 1


def test_model_aliases_are_pairs_or_a_json_object(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().model_aliases == {}
    monkeypatch.setenv("PONDER_MODEL_ALIASES", " gpt-4o = ponder, gpt-4o-mini=ponder-fast ")
    assert load_settings().model_aliases == {"gpt-4o": "ponder", "gpt-4o-mini": "ponder-fast"}
    monkeypatch.setenv("PONDER_MODEL_ALIASES", '{"o3": "ponder-deep"}')
    assert load_settings().model_aliases == {"o3": "ponder-deep"}


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("PONDER_MAX_PENDING", "zero", "PONDER_MAX_PENDING"),
        ("PONDER_PRIORITY_QUOTAS", "1,2", "6 positive integers"),
        ("PONDER_NODE_ID", "bad node", "PONDER_NODE_ID"),
        ("PONDER_API_KEYS", "secret-key", "SHA-256"),
        ("PONDER_SCRIPTED_STEP_MS", "-1,2", "non-negative"),
        ("PONDER_MODES__STANDARD__SAMPLES", "99", "PONDER_MODES__STANDARD__MAX_SAMPLES"),
        ("PONDER_PORT", "abc", "PONDER_PORT=abc"),
        ("PONDER_WEBHOOK_RETRY_S", "5,x", "PONDER_WEBHOOK_RETRY_S: item 2 (x)"),
        ("PONDER_MODES", "{not json", "PONDER_MODES: not valid JSON"),
        ("PONDER_MODES__DEEP__PATHS", "cot", "PONDER_MODES__DEEP__PATHS: not valid JSON"),
        ("PONDER_SANDBOX_ISOLATION", "docker", "'auto', 'bwrap' or 'rlimits'"),
        ("PONDER_ENGINE_WEIGHTS", "q8_0", "ENGINE_WEIGHTS=q8_0: Input should be 'f16' or 'gguf'"),
        ("PONDER_ENGINE_KV_TOKENS", "-1", "PONDER_ENGINE_KV_TOKENS=-1"),
        ("PONDER_ENGINE_THREADS", "many", "PONDER_ENGINE_THREADS=many"),
        ("PONDER_MODEL_ALIASES", "gpt-4o", "'gpt-4o' is not an alias=served-name pair"),
        ("PONDER_MODEL_ALIASES", "gpt-4o=gpt-5", "'gpt-4o' names 'gpt-5'; give one of ponder,"),
        ("PONDER_MODEL_ALIASES", "ponder=ponder-fast", "'ponder' is a served name already"),
        ("PONDER_MODEL_ALIASES", "{x", "PONDER_MODEL_ALIASES={x: not a valid JSON object"),
    ],
)
def test_bad_values_say_what_to_change(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_settings()


def test_secrets_are_not_repeated_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PONDER_API_KEYS", "pk_my_raw_secret_key")
    monkeypatch.setenv("PONDER_WEBHOOK_SECRET", "hunter2")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "PONDER_API_KEYS" in str(caught.value) and "PONDER_WEBHOOK_SECRET" in str(caught.value)
    assert "pk_my_raw_secret_key" not in str(caught.value) and "hunter2" not in str(caught.value)


# --- settings checked as a whole

CONFLICTS = [
    (
        {"PONDER_HEARTBEAT_S": "45"},
        "heartbeat (45 s) must be shorter than the lease (30 s): lower PONDER_HEARTBEAT_S or "
        "raise PONDER_LEASE_S",
    ),
    (
        {"PONDER_HEARTBEAT_S": "10", "PONDER_LEASE_S": "10"},
        "heartbeat (10 s) must be shorter than the lease (10 s)",
    ),
    (
        {"PONDER_BATCHING": "static", "PONDER_BATCH_MAX_BUFFER": "4"},
        "the batch buffer (4) must hold at least one full batch (8) with PONDER_BATCHING=static: "
        "raise PONDER_BATCH_MAX_BUFFER or lower PONDER_BATCH_MAX_SIZE",
    ),
    (
        {"PONDER_BATCHING": "static", "PONDER_BATCH_MAX_WAIT_MS": "60000"},
        "the static batching wait (60000 ms) must be shorter than the fast mode's sample "
        "timeout (60 s): lower PONDER_BATCH_MAX_WAIT_MS",
    ),
    (
        {"PONDER_ENGINE_MAX_WAIT_MS": "90000"},
        "the continuous batching wait (90000 ms) must be shorter than the fast mode's sample "
        "timeout (60 s): lower PONDER_ENGINE_MAX_WAIT_MS",
    ),
    (
        {"PONDER_MODES__DEEP__SAMPLE_TIMEOUT_S": "500"},
        "deep mode: sample_timeout_s (500) is over task_timeout_s (420, the whole task's time "
        "limit): lower PONDER_MODES__DEEP__SAMPLE_TIMEOUT_S or raise "
        "PONDER_MODES__DEEP__TASK_TIMEOUT_S",
    ),
    (
        {"PONDER_MODES__FAST__TASK_TIMEOUT_S": "700"},
        "fast mode: task_timeout_s (700) is over max_timeout_s (600",
    ),
    (
        {"PONDER_MODES__STANDARD__MAX_NEW_TOKENS": "4096"},
        "lower PONDER_MODES__STANDARD__MAX_NEW_TOKENS or raise "
        "PONDER_MODES__STANDARD__MAX_MAX_NEW_TOKENS",
    ),
    (
        {"PONDER_MODES__FAST__TEMPERATURE": "1.8"},
        "fast mode: temperature (1.8) is over max_temperature (1.5",
    ),
    (
        {"PONDER_MAX_PROMPT_CHARS": "300000"},
        "a prompt of PONDER_MAX_PROMPT_CHARS (300000 characters) can never arrive in a request "
        "body of PONDER_MAX_BODY_BYTES (262144 bytes)",
    ),
    (
        {"PONDER_MAX_BODY_BYTES": "2048"},
        "metadata of PONDER_MAX_METADATA_BYTES (4096 bytes) can never arrive",
    ),
]


@pytest.mark.parametrize(("env", "expected"), CONFLICTS)
def test_settings_that_contradict_each_other_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid configuration: ")
    assert expected in message
    for line in message.splitlines():  # one line per problem, each naming what to change
        assert line.startswith("invalid configuration: ") and "PONDER_" in line


def test_every_problem_is_reported_on_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PONDER_BATCHING", "static")
    monkeypatch.setenv("PONDER_HEARTBEAT_S", "45")
    monkeypatch.setenv("PONDER_BATCH_MAX_BUFFER", "4")
    monkeypatch.setenv("PONDER_MODES__DEEP__SAMPLE_TIMEOUT_S", "500")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    lines = str(caught.value).splitlines()
    assert len(lines) == 3
    assert ["PONDER_HEARTBEAT_S" in lines[0], "PONDER_BATCH_MAX_BUFFER" in lines[1]] == [True, True]
    assert "PONDER_MODES__DEEP__SAMPLE_TIMEOUT_S" in lines[2]


def test_consistent_edges_are_accepted() -> None:
    s = load_settings(
        heartbeat_s=29.9,
        batching="static",
        batch_max_buffer=8,
        max_prompt_chars=262_144,
        modes={"deep": {"sample_timeout_s": 420}},
    )
    assert (s.heartbeat_interval_s, s.batch_max_buffer, s.mode("deep").sample_timeout_s) == (
        29.9,
        8,
        420,
    )


def test_a_buffer_the_continuous_engine_never_uses_is_not_checked() -> None:
    assert load_settings(batch_max_buffer=4).batching == "continuous"


def test_each_cross_field_check_is_a_function_of_the_settings() -> None:
    defaults = load_settings()
    assert CROSS_FIELD_CHECKS
    for check in CROSS_FIELD_CHECKS:
        assert list(check(defaults)) == [], check.__name__


# --- through the command line: one line, no traceback ----------------------------------
SERVICE_COMMANDS = [["serve", "--port", "0"], ["api", "--port", "0"], ["worker"]]
CLIENT_COMMANDS = [
    ["submit", "What is 2 + 2?"],
    ["get", "1764412800123-x-1"],
    ["cancel", "1764412800123-x-1"],
    ["events", "1764412800123-x-1"],
    ["tasks"],
]
BAD_SERVICE_ENV = [
    ({"PONDER_HEARTBEAT_S": "45"}, "heartbeat (45 s) must be shorter than the lease (30 s)"),
    ({"PONDER_BATCHING": "static", "PONDER_BATCH_MAX_BUFFER": "4"}, "PONDER_BATCH_MAX_BUFFER"),
    ({"PONDER_LEASE_S": "soon"}, "PONDER_LEASE_S=soon: Input should be a valid number"),
    ({"PONDER_MODES": "{nope"}, "PONDER_MODES: not valid JSON"),
]
BAD_CLIENT_ENV = [
    ({"PONDER_URL": "localhost:8000"}, "'localhost:8000' (PONDER_URL) is not an http(s) URL"),
    ({"PONDER_API_KEY": "clé"}, "the API key (PONDER_API_KEY) must be printable ASCII"),
]


def _ponder(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PONDER_")}
    return subprocess.run(
        [sys.executable, "-m", "ponder.cli", *args],
        env={**clean, "PONDER_REDIS_URL": "redis://127.0.0.1:1/0", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [(a, e, x) for a in SERVICE_COMMANDS for e, x in BAD_SERVICE_ENV]
    + [(a, e, x) for a in CLIENT_COMMANDS for e, x in BAD_CLIENT_ENV],
)
def test_no_command_prints_a_traceback_for_a_configuration_error(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    done = _ponder(args, env)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output and 'File "' not in output
    assert expected in " ".join(done.stderr.split())  # rich wraps at the terminal's width
    service = args in SERVICE_COMMANDS
    assert done.stderr.startswith("error: invalid configuration: " if service else "error: ")


def test_the_default_engine_is_the_openvino_one(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.engine, s.model, s.engine_weights, s.engine_kv_tokens) == (
        "openvino",
        "smollm2-135m",
        "f16",
        0,
    )
    assert 1 <= s.engine_threads <= 4
    monkeypatch.setenv("PONDER_ENGINE_THREADS", "3")
    monkeypatch.setenv("PONDER_ENGINE_WEIGHTS", "gguf")
    monkeypatch.setenv("PONDER_ENGINE_KV_TOKENS", "4096")
    s = load_settings()
    assert (s.engine_threads, s.engine_weights, s.engine_kv_tokens) == (3, "gguf", 4096)


def test_a_setting_of_an_earlier_version_names_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PONDER_TORCH_THREADS", "2")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid configuration: PONDER_TORCH_THREADS is gone: set PONDER_ENGINE_THREADS"
    )


@pytest.mark.parametrize("name", ["PONDER_VOTE_WEIGHT", "PONDER_CONFIDENCE_WEIGHT"])
def test_a_removed_setting_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "0.5")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert str(caught.value) == f"invalid configuration: {name} is gone: it had no effect"
