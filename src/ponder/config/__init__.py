"""Settings: read from the environment (prefix ``PONDER_``) in this package only.

Every field has a default and a description, and cross-field checks say what to change
(:mod:`.settings`); the modes' defaults and caps are :mod:`.modes`.
:func:`load_settings` turns what is wrong into one line per problem. The SDK's and the
command line's own variables (``PONDER_URL``, ``PONDER_API_KEY``) are read here too
(:func:`client_environment`).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from ponder.config.modes import (
    AUTO_TARGET,
    AUTO_VOTE_TARGET,
    NUM_PRIORITIES,
    SERVED_MODELS,
    ModeConfig,
    default_modes,
)
from ponder.config.settings import CONFLICT, CROSS_FIELD_CHECKS, Settings
from ponder.errors import ConfigError

__all__ = [
    "AUTO_TARGET",
    "AUTO_VOTE_TARGET",
    "CROSS_FIELD_CHECKS",
    "NUM_PRIORITIES",
    "SERVED_MODELS",
    "ModeConfig",
    "Settings",
    "client_environment",
    "default_modes",
    "get_settings",
    "load_settings",
]

#: settings whose values an error message must not repeat
_SECRET_FIELDS = frozenset({"api_keys", "webhook_secret", "openai_api_key"})


def _describe(error: Any) -> str:
    """One line for one validation error: the variable, the value seen, what is wrong."""
    if error["type"] == CONFLICT:
        return str(error["ctx"]["problems"])
    names = [str(p) for p in error["loc"] if not isinstance(p, int)]
    items = [p for p in error["loc"] if isinstance(p, int)]
    var = "PONDER_" + "__".join(names).upper()
    message = str(error["msg"]).removeprefix("Value error, ")
    seen = error["input"]
    if (names and names[0] in _SECRET_FIELDS) or isinstance(seen, dict):
        return f"{var}: {message}"
    shown = (",".join(map(str, seen)) if isinstance(seen, list) else str(seen))[:80]
    if items:
        return f"{var}: item {items[0] + 1} ({shown}): {message}"
    return f"{var}={shown}: {message}"


def _unparsable(e: SettingsError) -> str:
    """A structured value (``PONDER_MODES``…) that is not JSON: name the variables set."""
    field = re.search(r'field "(\w+)"', str(e))
    prefix = f"PONDER_{field.group(1).upper()}" if field else "PONDER_"
    names = sorted(k for k in os.environ if k.upper().startswith(prefix)) or [prefix]
    return f"{' or '.join(names)}: not valid JSON ({e.__cause__ or e})"


#: settings of earlier versions, and what replaced them (a value set is refused, not ignored)
_REPLACED = {
    "PONDER_TORCH_THREADS": "set PONDER_ENGINE_THREADS",
    "PONDER_MODEL_RUNNER": "the local engine is PONDER_ENGINE=openvino (or transformers)",
    "PONDER_MODEL_WEIGHTS": "set PONDER_ENGINE_WEIGHTS (f16 or gguf)",
    "PONDER_LLAMA_WEIGHTS": "set PONDER_ENGINE_WEIGHTS (f16 or gguf)",
    "PONDER_LLAMA_KV_TOKENS": "set PONDER_ENGINE_KV_TOKENS",
    "PONDER_VOTE_WEIGHT": "it had no effect",
    "PONDER_CONFIDENCE_WEIGHT": "it had no effect",
}


def load_settings(**overrides: Any) -> Settings:
    """Read settings from the environment (and ``overrides``); raise ConfigError if wrong.

    The message has one line per problem, each naming the ``PONDER_`` variable(s) to
    change and the value(s) seen.
    """
    replaced = [
        f"invalid configuration: {old} is gone: {instead}"
        for old, instead in _REPLACED.items()
        if os.environ.get(old) is not None
    ]
    if replaced:
        raise ConfigError("\n".join(replaced))
    try:
        return Settings(**overrides)
    except ValidationError as e:
        lines = "\n".join(_describe(err) for err in e.errors()).splitlines()
        raise ConfigError("\n".join(f"invalid configuration: {line}" for line in lines)) from e
    except SettingsError as e:
        raise ConfigError(f"invalid configuration: {_unparsable(e)}") from e


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()


def client_environment() -> tuple[str | None, str | None]:
    """``PONDER_URL`` and ``PONDER_API_KEY``, for the SDK (and the command line through
    it) where the caller gives no URL or key."""
    return os.environ.get("PONDER_URL"), os.environ.get("PONDER_API_KEY")
