"""docs/configuration.md lists exactly the settings of ``Settings``, with their defaults."""

from __future__ import annotations

import importlib.util
import os
import re
from types import ModuleType

import pytest

from ponder.config import _REPLACED, Settings, load_settings
from tests.docs.markdown import ROOT

PAGE = ROOT / "docs" / "configuration.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_docs", ROOT / "scripts" / "gen_config_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows() -> dict[str, str]:
    """``PONDER_X`` → the default column, from the page's table of every setting."""
    text = PAGE.read_text(encoding="utf-8")
    gen = _generator()
    table = text[text.index(gen.BEGIN) : text.index(gen.END)]
    rows = re.findall(r"^\| `(PONDER_[A-Z0-9_]+)` \| (.*?) \| ", table, re.M)
    return dict(rows)


def test_the_page_is_the_rendering_of_settings() -> None:
    gen = _generator()
    text = PAGE.read_text(encoding="utf-8")
    assert gen.rewrite(text) == text, (
        "docs/configuration.md is stale: run scripts/gen_config_docs.py"
    )


def test_every_setting_has_a_row_and_no_row_is_not_a_setting() -> None:
    rows = _rows()
    expected = {f"PONDER_{name.upper()}" for name in Settings.model_fields}
    assert set(rows) == expected


@pytest.mark.parametrize(
    "name", [n for n in Settings.model_fields if n not in ("modes", "node_id", "engine_threads")]
)
def test_the_documented_default_is_the_default(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Set the variable to the default the page shows: the setting reads as its default."""
    for variable in list(os.environ):
        if variable.startswith("PONDER_"):
            monkeypatch.delenv(variable)
    shown = _rows()[f"PONDER_{name.upper()}"]
    default = getattr(load_settings(), name)
    if shown == "unset":
        assert default in (None, []), (name, default)
        return
    value = "" if shown == "empty" else re.fullmatch(r"`(.*)`", shown)
    assert value is not None, (name, shown)
    monkeypatch.setenv(f"PONDER_{name.upper()}", value if isinstance(value, str) else value[1])
    assert getattr(load_settings(), name) == default, (name, shown)


def test_the_refused_old_names_are_listed() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for old in _REPLACED:
        assert f"`{old}`" in text, old


def test_a_setting_added_to_settings_fails() -> None:
    """The rendering follows Settings: a new field changes it."""
    gen = _generator()
    before = gen.render()
    from pydantic import Field
    from pydantic_settings import SettingsConfigDict

    class More(Settings):
        model_config = SettingsConfigDict(env_prefix="PONDER_")
        brand_new_knob: int = Field(default=7, description="a setting nobody documented")

    setattr(gen, "Settings", More)  # noqa: B010 - a module loaded from a file
    try:
        assert "PONDER_BRAND_NEW_KNOB" in gen.render() != before
    finally:
        setattr(gen, "Settings", Settings)  # noqa: B010
