"""The settings checked as a whole: each check is one small function of the validated
settings that yields problems, one line each, naming the ``PONDER_`` variables to change
and the values seen. Add a check by appending it to :data:`CROSS_FIELD_CHECKS`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ponder.config.settings import Settings

__all__ = ["CROSS_FIELD_CHECKS"]

CONFLICT = "settings_conflict"


def _heartbeat_inside_lease(s: Settings) -> Iterator[str]:
    if s.heartbeat_s and s.heartbeat_s >= s.lease_s:
        yield (
            f"heartbeat ({s.heartbeat_s:g} s) must be shorter than the lease ({s.lease_s:g} s): "
            "lower PONDER_HEARTBEAT_S or raise PONDER_LEASE_S"
        )


def _buffer_holds_a_batch(s: Settings) -> Iterator[str]:
    if s.batching == "static" and s.batch_max_buffer < s.batch_max_size:
        yield (
            f"the batch buffer ({s.batch_max_buffer}) must hold at least one full batch "
            f"({s.batch_max_size}) with PONDER_BATCHING=static: raise PONDER_BATCH_MAX_BUFFER "
            "or lower PONDER_BATCH_MAX_SIZE"
        )


def _batch_wait_under_sample_timeouts(s: Settings) -> Iterator[str]:
    mode, config = min(s.modes.items(), key=lambda item: item[1].sample_timeout_s)
    var, wait_ms = (
        ("PONDER_BATCH_MAX_WAIT_MS", s.batch_max_wait_ms)
        if s.batching == "static"
        else ("PONDER_ENGINE_MAX_WAIT_MS", s.engine_max_wait_ms)
    )
    if wait_ms / 1000 >= config.sample_timeout_s:
        yield (
            f"the {s.batching} batching wait ({wait_ms:g} ms) must be shorter than the {mode} "
            f"mode's sample timeout ({config.sample_timeout_s:g} s): lower {var} or raise "
            f"PONDER_MODES__{mode.upper()}__SAMPLE_TIMEOUT_S"
        )


def _mode_defaults_within_caps(s: Settings) -> Iterator[str]:
    for mode, config in s.modes.items():
        var = f"PONDER_MODES__{mode.upper()}__"
        pairs = [
            ("samples", "max_samples", "the most samples a request may ask for"),
            ("max_new_tokens", "max_max_new_tokens", "the most tokens a request may ask for"),
            ("temperature", "max_temperature", "the highest temperature a request may ask for"),
            ("sample_timeout_s", "task_timeout_s", "the whole task's time limit"),
            ("task_timeout_s", "max_timeout_s", "the most timeout_s a request may ask for"),
        ]
        for low, high, meaning in pairs:
            value, cap = getattr(config, low), getattr(config, high)
            if value > cap:
                yield (
                    f"{mode} mode: {low} ({value:g}) is over {high} ({cap:g}, {meaning}): "
                    f"lower {var}{low.upper()} or raise {var}{high.upper()}"
                )


def _limits_fit_in_a_body(s: Settings) -> Iterator[str]:
    limits = [
        ("PONDER_MAX_PROMPT_CHARS", s.max_prompt_chars, "a prompt of", "characters"),
        ("PONDER_MAX_TESTS_CHARS", s.max_tests_chars, "tests of", "characters"),
        ("PONDER_MAX_METADATA_BYTES", s.max_metadata_bytes, "metadata of", "bytes"),
    ]
    for var, limit, what, unit in limits:
        if limit > s.max_body_bytes:
            yield (
                f"{what} {var} ({limit} {unit}) can never arrive in a request body of "
                f"PONDER_MAX_BODY_BYTES ({s.max_body_bytes} bytes): raise "
                f"PONDER_MAX_BODY_BYTES or lower {var}"
            )


CROSS_FIELD_CHECKS: list[Callable[[Settings], Iterator[str]]] = [
    _heartbeat_inside_lease,
    _buffer_holds_a_batch,
    _batch_wait_under_sample_timeouts,
    _mode_defaults_within_caps,
    _limits_fit_in_a_body,
]
