"""The models one ponder serves: ``PONDER_MODELS_FILE``, a TOML file of ``[models.NAME]``
tables (docs/models.md), read with pydantic-settings' TOML source.

Without the file, one model named ``ponder`` is built from the engine settings
(``PONDER_ENGINE``, ``PONDER_MODEL``…): what a deployment without a models file runs.
Each model's engine runs on a copy of the settings with its own keys put in
(:func:`engine_settings`), so an engine reads its settings as it always has.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, TomlConfigSettingsSource

from ponder.types import Mode

__all__ = [
    "DEFAULT_MODEL",
    "KEEP_LOADED",
    "ModelSpec",
    "default_model_spec",
    "engine_settings",
    "load_models",
    "served_names",
]

#: the one model's name without a models file (and the OpenAI name ``ponder``'s model)
DEFAULT_MODEL = "ponder"
#: ``keep_alive_s`` that keeps a model loaded until the worker stops
KEEP_LOADED = -1.0
#: a model's name: it is part of queue keys, OpenAI model names and metric labels
NAME_PATTERN = r"^[a-z0-9][a-z0-9._]*$"


class ModelSpec(BaseModel):
    """One ``[models.NAME]`` table: the engine that runs the model, and how."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["openvino", "transformers", "openai", "scripted"] = Field(
        description="the engine that runs the model"
    )
    model: str | None = Field(
        default=None,
        description="local engines: a packaged model (smollm2-135m, qwen0.5b), a .gguf "
        "file, or (transformers) a checkpoint directory",
    )
    base_url: str | None = Field(default=None, description="openai: the server's base URL")
    upstream_model: str | None = Field(
        default=None, description="openai: the model name the server is asked for"
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="openai: the environment variable that holds the server's key",
    )
    max_concurrency: int | None = Field(
        default=None, ge=1, description="openai: requests in flight at most"
    )
    max_rows: int | None = Field(default=None, ge=1, description="rows run at once (its batch)")
    threads: int | None = Field(default=None, ge=0, description="local engines: CPU threads")
    kv_tokens: int | None = Field(default=None, ge=0, description="openvino: KV cache positions")
    keep_alive_s: float = Field(
        default=300.0,
        description="seconds a local model stays loaded with no task; -1 keeps it loaded",
    )
    queue_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="default of a task's queue_timeout_s: a task not started in time ends expired",
    )
    escalate_to: str | None = Field(
        default=None,
        description="auto mode: the model a task continues on when this one's last stage "
        "ends below its target",
    )

    @model_validator(mode="after")
    def _keys_of_its_engine(self) -> ModelSpec:
        if self.keep_alive_s < 0 and self.keep_alive_s != KEEP_LOADED:
            raise ValueError("keep_alive_s: seconds (0 or more), or -1 to keep it loaded")
        remote = {"base_url", "upstream_model", "api_key_env", "max_concurrency"}
        local = {"model", "threads", "kv_tokens"}
        wrong = (local if self.engine == "openai" else remote) & self.model_fields_set
        if wrong:
            raise ValueError(f"{', '.join(sorted(wrong))}: not a key of the {self.engine} engine")
        if self.engine == "openai" and not (self.base_url and self.upstream_model):
            raise ValueError("the openai engine needs base_url and upstream_model")
        if self.engine in ("openvino", "transformers") and not self.model:
            raise ValueError(f"the {self.engine} engine needs model")
        return self

    @property
    def local(self) -> bool:
        """Whether the model runs in this process's engine (loaded on demand)."""
        return self.engine != "openai"


class _EngineSettings(Protocol):
    """What :func:`load_models` reads of the settings (:class:`ponder.config.Settings`)."""

    @property
    def models_file(self) -> str | None: ...
    @property
    def engine(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def queue_timeout_s(self) -> float | None: ...


_S = TypeVar("_S", bound=BaseModel)


class _ModelsFile(BaseModel):
    """The file's contents: ``[models.NAME]`` tables, in the file's order."""

    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelSpec] = Field(min_length=1)


class _Toml(BaseSettings):
    """What :class:`~pydantic_settings.TomlConfigSettingsSource` reads for (no fields)."""


def load_models(settings: _EngineSettings) -> tuple[dict[str, ModelSpec], list[str]]:
    """The models ``settings`` serve, by name (the file's order; the first is the
    default), and the problems found: one line each, naming the model and key."""
    if not settings.models_file:
        return {DEFAULT_MODEL: default_model_spec(settings)}, []
    path = Path(settings.models_file).expanduser()
    where = f"PONDER_MODELS_FILE={settings.models_file}"
    if not path.is_file():
        return {}, [f"{where}: no such file"]
    try:
        raw = TomlConfigSettingsSource(_Toml, toml_file=path)()
        models = _ModelsFile.model_validate(raw).models
    except ValidationError as e:
        return {}, [f"{where}: {_describe(err)}" for err in e.errors()]
    except ValueError as e:  # TOML that does not parse
        return {}, [f"{where}: not valid TOML ({e})"]
    problems = [
        f"{where}: models.{name}: a name is lowercase letters, digits, '.' and '_'"
        for name in models
        if not _valid_name(name)
    ]
    for name, spec in models.items():
        if spec.escalate_to is not None and spec.escalate_to not in models:
            problems.append(
                f"{where}: models.{name}.escalate_to: no model {spec.escalate_to!r} in the "
                f"file (it has {', '.join(models)})"
            )
        elif spec.escalate_to == name:
            problems.append(
                f"{where}: models.{name}.escalate_to: a model cannot escalate to itself"
            )
        if spec.api_key_env and spec.api_key_env not in os.environ:
            problems.append(
                f"{where}: models.{name}.api_key_env: the variable {spec.api_key_env} is not set"
            )
    return models, problems


def _valid_name(name: str) -> bool:
    return re.fullmatch(NAME_PATTERN, name) is not None


def _describe(error: Any) -> str:
    path = ".".join(str(p) for p in error["loc"])
    return f"{path}: {str(error['msg']).removeprefix('Value error, ')}"


def default_model_spec(settings: _EngineSettings) -> ModelSpec:
    """The one model of a deployment without a models file: its engine settings."""
    return ModelSpec.model_construct(
        engine=settings.engine,  # any registered engine (model_construct does not check)
        model=settings.model,
        keep_alive_s=KEEP_LOADED,
        queue_timeout_s=settings.queue_timeout_s,
    )


def engine_settings(settings: _S, spec: ModelSpec) -> _S:
    """``settings`` with the model's own keys put in, for its engine."""
    update: dict[str, Any] = {"engine": spec.engine}
    keys = {
        "model": "model",
        "base_url": "openai_base_url",
        "upstream_model": "openai_model",
        "max_concurrency": "openai_max_concurrency",
        "max_rows": "engine_max_rows",
        "threads": "engine_threads",
        "kv_tokens": "engine_kv_tokens",
    }
    for key, field in keys.items():
        value = getattr(spec, key)
        if value is not None:
            update[field] = value
    if spec.api_key_env:
        update["openai_api_key"] = os.environ.get(spec.api_key_env, "")
    return settings.model_copy(update=update)


def served_names(models: dict[str, ModelSpec]) -> dict[str, tuple[str, Mode | None]]:
    """The model names requests may give for ``models`` (the first is the default), each
    with the model and the mode it stands for: ``ponder`` / ``ponder-<mode>`` the default
    model (or a model named ``ponder``), ``NAME`` / ``NAME-<mode>`` each model."""
    names: dict[str, tuple[str, Mode | None]] = {}
    if not models:
        return names
    for model in (DEFAULT_MODEL, *models):
        target = next(iter(models)) if model == DEFAULT_MODEL and model not in models else model
        names[model] = (target, None)
        names.update({f"{model}-{mode.value}": (target, mode) for mode in Mode})
    return names
