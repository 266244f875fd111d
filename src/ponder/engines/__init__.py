"""Engines, chosen by name (``PONDER_ENGINE``) through one registry."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ponder.config import Settings
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.errors import ConfigError

__all__ = [
    "ENGINES",
    "BaseEngine",
    "EngineEntry",
    "SampleOutput",
    "SampleRequest",
    "create_engine",
    "describe_engine",
    "register_engine",
]


@dataclass(frozen=True)
class EngineEntry:
    #: ``"package.module:factory"``; the factory takes the settings. Modules are imported
    #: lazily so that the API process never imports torch.
    target: str
    #: runs PONDER_MODEL on this machine, in PONDER_ENGINE_THREADS threads
    local_model: bool = False


#: every engine, by the name PONDER_ENGINE gives: the one list of engine names
ENGINES: dict[str, EngineEntry] = {
    "scripted": EngineEntry("ponder.engines.scripted:ScriptedEngine"),
    "openvino": EngineEntry("ponder.engines.openvino:OpenVINOEngine", local_model=True),
    "transformers": EngineEntry("ponder.engines.transformers:TransformersEngine", local_model=True),
    "openai": EngineEntry("ponder.engines.openai:OpenAIEngine"),
}


def register_engine(name: str, target: str, *, local_model: bool = False) -> None:
    """Add an engine: ``target`` is ``"package.module:ClassName"``."""
    ENGINES[name] = EngineEntry(target, local_model)


def describe_engine(settings: Settings) -> str:
    """The configured engine in a few words, for the start-up line: its name, and for a
    local model the model and the threads."""
    entry = ENGINES.get(settings.engine)
    if entry is not None and entry.local_model:
        return f"{settings.engine} ({settings.model}, {settings.engine_threads} thread(s))"
    return settings.engine


def create_engine(settings: Settings) -> BaseEngine:
    """The engine named by ``settings.engine``; ConfigError for an unknown name."""
    entry = ENGINES.get(settings.engine)
    if entry is None:
        raise ConfigError(
            f"unknown engine {settings.engine!r} (PONDER_ENGINE); choose one of: "
            + ", ".join(sorted(ENGINES))
        )
    module_name, _, attr = entry.target.partition(":")
    factory: Callable[[Settings], BaseEngine] = getattr(importlib.import_module(module_name), attr)
    return factory(settings)
