from __future__ import annotations

import pytest

from ponder.config import Mode, load_settings
from ponder.errors import ConfigError


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


@pytest.mark.parametrize(
    ("var", "value", "fragment"),
    [
        ("PONDER_MAX_PENDING", "zero", "PONDER_MAX_PENDING"),
        ("PONDER_PRIORITY_QUOTAS", "1,2", "6 positive integers"),
        ("PONDER_NODE_ID", "bad node", "PONDER_NODE_ID"),
        ("PONDER_API_KEYS", "secret-key", "SHA-256"),
        ("PONDER_SCRIPTED_STEP_MS", "-1,2", "non-negative"),
        ("PONDER_MODES__STANDARD__SAMPLES", "99", "max_samples"),
    ],
)
def test_bad_values_say_what_to_change(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=fragment):
        load_settings()
