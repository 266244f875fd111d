"""The models file (PONDER_MODELS_FILE): read, validated at start, one line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from ponder.config import load_settings
from ponder.config.models import DEFAULT_MODEL, KEEP_LOADED, engine_settings
from ponder.errors import ConfigError
from ponder.types import Mode

TWO_MODELS = """
[models.small]
engine = "openvino"
model = "smollm2-135m"
threads = 1
keep_alive_s = 60
escalate_to = "big"

[models.big]
engine = "openai"
base_url = "http://127.0.0.1:8001/v1"
upstream_model = "Qwen/Qwen2.5-7B-Instruct"
api_key_env = "BIG_KEY"
max_concurrency = 8
queue_timeout_s = 30
"""


def _file(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("PONDER_MODELS_FILE", str(path))
    return path


def test_without_a_file_one_model_from_the_engine_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PONDER_ENGINE", "scripted")
    settings = load_settings()
    assert list(settings.models) == [DEFAULT_MODEL] == [settings.default_model]
    spec = settings.models[DEFAULT_MODEL]
    assert (spec.engine, spec.keep_alive_s) == ("scripted", KEEP_LOADED)
    assert engine_settings(settings, spec).engine == "scripted"


def test_a_file_of_two_models_in_its_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _file(tmp_path, TWO_MODELS, monkeypatch)
    monkeypatch.setenv("BIG_KEY", "sk-upstream")
    settings = load_settings()
    assert list(settings.models) == ["small", "big"]
    assert settings.default_model == "small"
    small, big = settings.models["small"], settings.models["big"]
    assert (small.escalate_to, small.keep_alive_s, small.local) == ("big", 60, True)
    assert (big.queue_timeout_s, big.local) == (30, False)
    # each engine runs on the settings with its model's keys put in
    local = engine_settings(settings, small)
    assert (local.engine, local.model, local.engine_threads) == ("openvino", "smollm2-135m", 1)
    remote = engine_settings(settings, big)
    assert (remote.engine, remote.openai_model, remote.openai_api_key) == (
        "openai",
        "Qwen/Qwen2.5-7B-Instruct",
        "sk-upstream",
    )
    assert remote.openai_max_concurrency == 8
    assert settings.engine == "openvino"  # the settings themselves are unchanged


def test_served_names_are_each_model_and_its_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _file(tmp_path, TWO_MODELS, monkeypatch)
    monkeypatch.setenv("BIG_KEY", "k")
    monkeypatch.setenv("PONDER_MODEL_ALIASES", "gpt-4o=big-deep,gpt-4o-mini=ponder")
    settings = load_settings()
    names = settings.served_names()
    assert names["big"] == ("big", None)
    assert names["big-deep"] == ("big", Mode.deep)
    assert names["ponder"] == ("small", None)  # today's names: the default model
    assert names["ponder-fast"] == ("small", Mode.fast)
    assert settings.model_aliases["gpt-4o"] == "big-deep"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        (
            '[models.a]\nengine = "openai"\nmodel = "x"\nbase_url = "u"\nupstream_model = "m"\n',
            "models.a: model: not a key of the openai engine",
        ),
        ('[models.a]\nengine = "openai"\n', "models.a: the openai engine needs base_url"),
        ('[models.a]\nengine = "openvino"\n', "models.a: the openvino engine needs model"),
        ('[models.a]\nengine = "scripted"\nthreadz = 2\n', "models.a.threadz: Extra inputs"),
        ('[models.a]\nengine = "llama"\n', "models.a.engine: Input should be"),
        (
            '[models.a]\nengine = "scripted"\nkeep_alive_s = -5\n',
            "models.a: keep_alive_s: seconds (0 or more), or -1",
        ),
        ('[models.a]\nengine = "scripted"\nmax_rows = 0\n', "models.a.max_rows: Input should be"),
        (
            '[models.a]\nengine = "scripted"\nescalate_to = "b"\n',
            "models.a.escalate_to: no model 'b' in the file (it has a)",
        ),
        (
            '[models.a]\nengine = "scripted"\nescalate_to = "a"\n',
            "models.a.escalate_to: a model cannot escalate to itself",
        ),
        ('[models.A]\nengine = "scripted"\n', "models.A: a name is lowercase letters"),
        ("[models]\n", "models: Dictionary should have at least 1 item"),
        ("[models.a\n", "not valid TOML"),
        (
            '[models.a]\nengine = "openai"\nbase_url = "u"\nupstream_model = "m"\n'
            'api_key_env = "NO_SUCH_VARIABLE_SET"\n',
            "models.a.api_key_env: the variable NO_SUCH_VARIABLE_SET is not set",
        ),
    ],
)
def test_each_mistake_is_one_line_naming_the_model_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, line: str
) -> None:
    path = _file(tmp_path, text, monkeypatch)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = str(raised.value)
    assert f"invalid configuration: PONDER_MODELS_FILE={path}: " in message
    assert line in message
    assert "Traceback" not in message


def test_a_missing_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PONDER_MODELS_FILE", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match=r"PONDER_MODELS_FILE=.*nope\.toml: no such file"):
        load_settings()


def test_an_alias_of_an_unknown_model_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _file(tmp_path, '[models.a]\nengine = "scripted"\n', monkeypatch)
    monkeypatch.setenv("PONDER_MODEL_ALIASES", "gpt-4o=b")
    with pytest.raises(ConfigError, match="PONDER_MODEL_ALIASES: 'gpt-4o' names 'b'; give one of"):
        load_settings()
