"""Engines, chosen by name (``PONDER_ENGINE``) through one registry."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ponder.config import Settings
from ponder.engines.base import BaseEngine, SampleOutput, SampleRequest
from ponder.errors import ConfigError

__all__ = ["ENGINES", "BaseEngine", "SampleOutput", "SampleRequest", "create_engine"]

#: name -> "module:factory"; the factory takes the settings. Modules are imported lazily
#: so that the API process never imports torch.
ENGINES: dict[str, str] = {
    "scripted": "ponder.engines.scripted:ScriptedEngine",
    "openvino": "ponder.engines.openvino:OpenVINOEngine",
    "transformers": "ponder.engines.transformers:TransformersEngine",
    "openai": "ponder.engines.openai:OpenAIEngine",
}


def register_engine(name: str, target: str) -> None:
    """Add an engine: ``target`` is ``"package.module:ClassName"``."""
    ENGINES[name] = target


def create_engine(settings: Settings) -> BaseEngine:
    """The engine named by ``settings.engine``; ConfigError for an unknown name."""
    target = ENGINES.get(settings.engine)
    if target is None:
        raise ConfigError(
            f"unknown engine {settings.engine!r} (PONDER_ENGINE); choose one of: "
            + ", ".join(sorted(ENGINES))
        )
    module_name, _, attr = target.partition(":")
    factory: Callable[[Settings], BaseEngine] = getattr(importlib.import_module(module_name), attr)
    return factory(settings)
