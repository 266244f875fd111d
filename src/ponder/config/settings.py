"""The settings (:class:`Settings`): every field read from ``PONDER_<FIELD>``, with its
default and description; each field checked alone, then the settings as a whole
(:data:`CROSS_FIELD_CHECKS`)."""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ponder.config.models import (
    DEFAULT_MODEL,
    ModelSpec,
    default_model_spec,
    load_models,
    served_names,
)
from ponder.config.modes import NUM_PRIORITIES, SERVED_MODELS, ModeConfig, default_modes
from ponder.types import Mode

__all__ = ["CONFLICT", "CROSS_FIELD_CHECKS", "Settings"]


def _default_node_id() -> str:
    host = "".join(c for c in socket.gethostname().split(".")[0] if c.isalnum() or c == "_")
    return f"{host[:12] or 'node'}.{os.getpid()}"


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _parse_aliases(value: Any) -> Any:
    """``alias=served-name`` pairs, comma-separated, or a JSON object, as a dict."""
    if not isinstance(value, str):
        return value
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except ValueError as e:
            raise ValueError(f"not a valid JSON object ({e})") from e
    pairs = {}
    for part in _split_csv(value):
        alias, sep, served = (p.strip() for p in part.partition("="))
        if not sep:
            raise ValueError(f"{part!r} is not an alias=served-name pair, e.g. gpt-4o=ponder")
        pairs[alias] = served
    return pairs


class Settings(BaseSettings):
    """ponder's configuration. Each field is read from ``PONDER_<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="PONDER_", env_nested_delimiter="__", extra="ignore", validate_default=True
    )

    # --- store ------------------------------------------------------------------------
    redis_url: str | None = Field(
        default=None, description="Redis URL; unset means the embedded SQLite store"
    )
    sqlite_path: str = Field(default="./ponder.db", description="file of the embedded store")
    key_prefix: str = Field(default="ponder", description="prefix of every Redis key")
    task_ttl_s: int = Field(default=86_400, ge=1, description="how long finished tasks are kept")
    store_timeout_s: float = Field(default=2.0, gt=0, description="time limit of one store call")
    redis_max_connections: int = Field(
        default=1024,
        ge=8,
        description="connections per Redis pool of a process (each event stream followed "
        "holds one while it waits)",
    )

    # --- api --------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="address the HTTP server binds to")
    port: int = Field(default=8000, ge=0, le=65535)
    node_id: str = Field(
        default_factory=_default_node_id,
        pattern=r"^[A-Za-z0-9_.]+$",
        description="names this process in task ids",
    )
    max_pending: int = Field(default=500, ge=1, description="backlog limit of pending tasks")
    max_prompt_chars: int = Field(default=32_000, ge=1, description="longest prompt accepted")
    max_body_bytes: int = Field(default=262_144, ge=1024, description="largest request body")
    max_metadata_bytes: int = Field(default=4096, ge=0)
    max_tests_chars: int = Field(default=32_000, ge=0)
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After of a 503 queue_full")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="SHA-256 hex digests of the accepted API keys"
    )
    model_aliases: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="more model names the OpenAI-compatible routes accept (and /v1/models "
        "lists): alias=served-name pairs, comma-separated (or a JSON object), e.g. "
        "gpt-4o=ponder,gpt-4o-mini=ponder-fast; a served name is one of "
        + ", ".join(SERVED_MODELS),
    )

    # --- limits -----------------------------------------------------------------------
    # Off by default: the default deployment is one trusted local user (loopback, no
    # keys), and the backlog limit (max_pending, 503 queue_full) already protects the
    # workers. A shared deployment sets a rate per key, e.g. 20/s with a burst of 40.
    rate_limit_per_s: float = Field(
        default=0.0,
        ge=0,
        description="requests per second per API key (per client address without auth) "
        "on /v1 routes; 0 = no rate limit",
    )
    rate_limit_burst: int = Field(
        default=0, ge=0, description="token bucket size (requests at once); 0 = 2 x the rate"
    )

    # --- worker -----------------------------------------------------------------------
    worker_max_tasks: int = Field(default=32, ge=1, description="tasks in flight per worker")
    priority_quotas: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: [4, 3, 2, 2, 1, 1],
        description="weighted fair share across priorities 0..5",
    )
    lease_s: float = Field(default=30.0, gt=0, description="a claimed task's lease")
    heartbeat_s: float = Field(default=0.0, ge=0, description="lease renewal; 0 = lease_s/3")
    max_deliveries: int = Field(default=5, ge=1, description="claims of one task before failing")
    claim_block_ms: int = Field(default=1000, ge=10, description="idle wait of one claim call")
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="`ponder worker`: serve the process's Prometheus metrics on this port "
        "(bound to PONDER_HOST); unset: none (`serve` and `api` have /metrics)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO", description="the processes' log level (any case)"
    )
    modes: dict[Mode, ModeConfig] = Field(default_factory=default_modes)

    # --- enhancement ------------------------------------------------------------------
    early_stop_window: int = Field(
        default=3, ge=2, description="early stop: at most this many samples run at once"
    )
    clarify_below: float = Field(
        default=0.5, ge=0, le=1, description="deep mode asks a clarifying question below this"
    )
    promote_first_by: int = Field(
        default=2, ge=0, le=5, description="deep mode: priority levels the first sample gains"
    )
    sandbox_timeout_s: float = Field(default=5.0, gt=0, description="program/test run limit")
    sandbox_memory_mb: int = Field(default=256, ge=32, description="program/test memory limit")
    sandbox_isolation: Literal["auto", "bwrap", "rlimits"] = Field(
        default="auto",
        description="how model-written programs are isolated: bwrap (namespaces; fail if it "
        "cannot run), rlimits (best effort), auto (bwrap when it works, else rlimits)",
    )

    # --- scheduling -------------------------------------------------------------------
    batching: Literal["continuous", "static"] = Field(
        default="continuous",
        description="continuous: rows join and leave the engine's running batch at every "
        "step; static: the DynamicBatcher runs whole batches (the old baseline)",
    )
    engine_max_rows: int = Field(
        default=16, ge=1, description="rows a local engine runs at once (its batch)"
    )
    engine_step_tokens: int = Field(
        default=256,
        ge=16,
        description="prompt tokens prefilled per decode step at most; a longer prompt is "
        "prefilled in chunks between steps",
    )
    engine_max_wait_ms: float = Field(
        default=0.0,
        ge=0,
        description="with slots free and few rows running, wait up to this long to start "
        "newcomers together (0: start each at the next step)",
    )
    engine_max_queue: int = Field(
        default=1000, ge=1, description="rows waiting for an engine slot at most"
    )
    engine_prefix_cache_mb: float = Field(
        default=64.0,
        ge=0,
        description="prompt KV caches kept for reuse (LRU), MB; 0 = off (the openvino "
        "engine: on or off; its pipeline keeps prompts in the KV cache's free blocks)",
    )
    engine_preempt_after_ms: float = Field(
        default=500.0,
        ge=0,
        description="with every slot taken, a row that waited this long preempts a running "
        "row at least two priority levels less urgent (it resumes later); 0 = never",
    )
    # the static batcher (PONDER_BATCHING=static)
    batch_max_size: int = Field(default=8, ge=1, description="static: requests per engine call")
    batch_max_wait_ms: float = Field(
        default=50.0, ge=0, description="static: longest wait of the oldest buffered request"
    )
    batch_max_buffer: int = Field(default=1000, ge=1, description="static: buffered requests")
    batch_max_concurrent: int = Field(default=1, ge=1, description="static: batches at once")
    batch_bucket_edges: Annotated[list[int], NoDecode] = Field(
        default_factory=lambda: [64, 256, 1024],
        description="static: prompt-length bucket edges (tokens, or characters)",
    )
    batch_adaptive: bool = Field(
        default=True, description="static: dispatch early when a full batch is not expected"
    )

    # --- engine -----------------------------------------------------------------------
    engine: str = Field(
        default="openvino",
        description="engine name: openvino (local model, OpenVINO GenAI in an engine process "
        "of its own), transformers (local model on torch: the hf extra), openai, or "
        "scripted (test double)",
    )
    model: str = Field(
        default="smollm2-135m",
        description="local engines: a packaged model name (smollm2-135m, qwen0.5b), a .gguf "
        "file, or (transformers engine) a checkpoint directory",
    )
    model_cache_dir: str = Field(
        default="~/.cache/ponder/models", description="where converted models are cached"
    )
    engine_weights: Literal["f16", "gguf"] = Field(
        default="f16",
        description="openvino engine's weights, written once into the model cache: f16 "
        "(every tensor dequantized to float16: the answers of the float32 model), gguf (the "
        "file's own quantized tensors, those OpenVINO cannot read repacked to q8_0: smaller "
        "and faster, but the answers change: qwen0.5b kept 39 of 50 short answers)",
    )
    engine_kv_tokens: int = Field(
        default=0,
        ge=0,
        description="openvino engine's KV cache, in positions over all rows (allocated at "
        "start); 0: 1024 per row of engine_max_rows",
    )
    engine_threads: int = Field(
        default_factory=lambda: max(1, min(4, (os.cpu_count() or 2) // 2)),
        ge=0,
        description="CPU threads of a local engine's model (default: half the cores, 1..4); "
        "0 = the library's own choice",
    )
    openai_base_url: str = Field(
        default="http://127.0.0.1:8001/v1", description="openai engine: server base URL"
    )
    openai_api_key: str = Field(default="", description="openai engine: bearer key")
    openai_model: str = Field(default="", description="openai engine: model name to ask for")
    openai_timeout_s: float = Field(default=120.0, gt=0)
    openai_max_retries: int = Field(default=3, ge=0)
    openai_max_concurrency: int = Field(
        default=64, ge=1, description="openai engine: requests in flight at most"
    )
    # --- models (docs/models.md) --------------------------------------------------------
    models_file: str | None = Field(
        default=None,
        description="a TOML file of [models.NAME] tables: the models served (the first is the "
        "default); unset: one model, `ponder`, from the engine settings",
    )
    max_loaded_models: int = Field(
        default=3,
        ge=1,
        description="local models loaded at once by a worker process (the least recently "
        "used idle one is unloaded to make room)",
    )
    queue_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="a task not started this many seconds after it was created ends expired "
        "(a model's queue_timeout_s and a request's override it); unset: no limit",
    )
    scripted_step_ms: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [0.0, 0.0],
        description="scripted engine latency per step: base,per_row (ms)",
    )

    # --- result channels: events and webhooks ------------------------------------------
    events_keepalive_s: float = Field(
        default=15.0, gt=0, description="SSE keep-alive comment interval (also the WS idle tick)"
    )
    delta_interval_ms: float = Field(
        default=100.0,
        ge=0,
        description="text of running samples published as `delta` events at most this often "
        "per sample (ms); 0: no delta events",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="signing secret `whsec_<base64>`; needed to accept tasks with callback_url",
    )
    webhook_retry_s: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [5.0, 30.0, 120.0, 600.0, 1800.0, 7200.0],
        description="delays before each webhook retry (s); its length is the number of retries",
    )
    webhook_timeout_s: float = Field(default=10.0, gt=0, description="one delivery attempt")
    webhook_max_response_bytes: int = Field(
        default=65_536, ge=0, description="most of a receiver's answer read back"
    )
    webhook_max_in_flight: int = Field(
        default=16, ge=1, description="webhook attempts in flight at once per worker process"
    )
    webhook_max_per_host: int = Field(
        default=4, ge=1, description="of those, at most this many to one host:port"
    )
    callback_allow_private: bool = Field(
        default=False,
        description="accept callback URLs on loopback/private/link-local addresses (tests)",
    )

    # --- the OpenAI-compatible asynchronous APIs: responses, files, batches -------------
    webhook_url: str | None = Field(
        default=None,
        description="where response.* and batch.* webhooks go (OpenAI's shape) for background "
        "responses and batches that name no webhook_url of their own; unset = none",
    )
    files_dir: str | None = Field(
        default=None,
        description="directory for the contents of uploaded and batch output files (large "
        "files; shared by every process); unset = in the store",
    )
    files_max_bytes: int = Field(
        default=33_554_432, ge=1024, description="largest file upload (bytes)"
    )
    files_ttl_s: int = Field(
        default=2_592_000, ge=60, description="how long files are kept (30 days, as OpenAI's)"
    )
    batch_max_lines: int = Field(
        default=50_000, ge=1, description="most requests in one batch input file"
    )
    batch_priority: int = Field(
        default=5, ge=0, le=5, description="priority of the tasks of batch lines"
    )
    batch_max_in_flight: int = Field(
        default=8,
        ge=1,
        description="batch lines admitted and not yet finished, over all batches (default: "
        "half a worker's engine rows); the most batch lines pending at once (their own "
        "backlog: never counted in max_pending)",
    )
    batch_interactive_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="admit batch lines only while other pending tasks are below this share "
        "of max_pending",
    )
    batch_tick_s: float = Field(
        default=0.2, gt=0, description="interval of the batch feeder's control loop"
    )

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        return [k.lower() for k in _split_csv(value)]

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
                raise ValueError(
                    "each entry must be the SHA-256 hex digest of a key (64 hex characters); "
                    "`ponder keys new` prints one"
                )
        return value

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _read_aliases(cls, value: Any) -> Any:
        return _parse_aliases(value)

    @field_validator("model_aliases")
    @classmethod
    def _check_aliases(cls, value: dict[str, str]) -> dict[str, str]:
        for alias in value:
            if not alias or len(alias) > 200 or not alias.isprintable():
                raise ValueError(f"the alias {alias!r} must be 1 to 200 printable characters")
        return value  # what they name: _aliases_name_served_models, once the models are read

    @field_validator(
        "priority_quotas",
        "scripted_step_ms",
        "batch_bucket_edges",
        "webhook_retry_s",
        mode="before",
    )
    @classmethod
    def _parse_numbers(cls, value: Any) -> Any:
        return _split_csv(value)

    @field_validator("priority_quotas")
    @classmethod
    def _check_quotas(cls, value: list[int]) -> list[int]:
        if len(value) != NUM_PRIORITIES or any(q < 1 for q in value):
            raise ValueError(f"give {NUM_PRIORITIES} positive integers, e.g. 4,3,2,2,1,1")
        return value

    @field_validator("scripted_step_ms")
    @classmethod
    def _check_latency(cls, value: list[float]) -> list[float]:
        if len(value) != 2 or any(v < 0 for v in value):
            raise ValueError("give two non-negative numbers: base_ms,per_row_ms, e.g. 20,1.5")
        return value

    @field_validator("batch_bucket_edges")
    @classmethod
    def _check_edges(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(value)) or any(v < 1 for v in value):
            raise ValueError("give increasing positive integers, e.g. 64,256,1024")
        return value

    @field_validator("webhook_retry_s")
    @classmethod
    def _check_retry_delays(cls, value: list[float]) -> list[float]:
        if any(not 0 <= v < float("inf") for v in value):
            raise ValueError("give non-negative delays in seconds, e.g. 5,30,120,600,1800,7200")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _check_webhook_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        raw = value.get_secret_value()
        try:
            body = raw.removeprefix("whsec_")
            key = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except ValueError:
            key = b""
        if not raw.startswith("whsec_") or not key:
            raise ValueError(
                "give a secret of the form whsec_<base64>; `ponder keys webhook-secret` prints one"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("modes", mode="before")
    @classmethod
    def _complete_modes(cls, value: Any) -> Any:
        """Partial overrides (``PONDER_MODES__DEEP__SAMPLES=7``) keep the other defaults."""
        if not isinstance(value, dict):
            return value
        merged: dict[str, Any] = {m.value: c.model_dump() for m, c in default_modes().items()}
        for name, override in value.items():
            key = name.value if isinstance(name, Mode) else str(name).lower()
            if isinstance(override, ModeConfig):
                override = override.model_dump()
            merged[key] = (
                {**merged.get(key, {}), **override} if isinstance(override, dict) else override
            )
        return merged

    #: the models served, by name (the first is the default): :mod:`ponder.config.models`
    _models: dict[str, ModelSpec] = PrivateAttr(default_factory=dict)
    _served: dict[str, tuple[str, Mode | None]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check_as_a_whole(self) -> Settings:
        problems = [problem for check in CROSS_FIELD_CHECKS for problem in check(self)]
        self._models, in_file = load_models(self)
        self._served = served_names(self._models)
        problems += in_file or list(_aliases_name_served_models(self))
        if problems:
            raise PydanticCustomError(CONFLICT, "{problems}", {"problems": "\n".join(problems)})
        return self

    @property
    def heartbeat_interval_s(self) -> float:
        return self.heartbeat_s or self.lease_s / 3

    def mode(self, mode: Mode | str) -> ModeConfig:
        return self.modes[Mode(mode)]

    @property
    def models(self) -> dict[str, ModelSpec]:
        """The models served, by name, in the models file's order. Without a file, the one
        model of the engine settings as they are now (a copy of the settings with another
        engine, ``model_copy(update=…)``, serves that engine)."""
        if not self.models_file:
            return {DEFAULT_MODEL: default_model_spec(self)}
        return self._models

    def served_names(self) -> dict[str, tuple[str, Mode | None]]:
        """The model names requests may give (aliases aside) and the model and mode each
        stands for (:func:`ponder.config.models.served_names`, made once)."""
        return self._served

    @property
    def default_model(self) -> str:
        """The model of a request that names none (the models file's first)."""
        return next(iter(self._models))


# --- settings checked as a whole ------------------------------------------------------
# Each check is one small function of the validated settings that yields problems: one
# line each, naming the PONDER_ variables to change and the values seen. Add a check by
# appending it to CROSS_FIELD_CHECKS.
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


def _aliases_name_served_models(s: Settings) -> Iterator[str]:
    served = s.served_names()
    for alias, target in s.model_aliases.items():
        if alias in served:
            yield f"PONDER_MODEL_ALIASES: {alias!r} is a served name already; aliases name others"
        elif target not in served:
            yield (
                f"PONDER_MODEL_ALIASES: {alias!r} names {target!r}; give one of "
                + ", ".join(served)
            )


CROSS_FIELD_CHECKS: list[Callable[[Settings], Iterator[str]]] = [
    _heartbeat_inside_lease,
    _buffer_holds_a_batch,
    _batch_wait_under_sample_timeouts,
    _mode_defaults_within_caps,
    _limits_fit_in_a_body,
]
