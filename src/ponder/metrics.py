"""Prometheus metrics, defined once here.

Each process has its own registry: the all-in-one ``ponder serve`` shows everything on
``GET /metrics``, ``ponder api`` shows API and queue figures there, and each
``ponder worker`` serves its own (batches, engine, samples, finished tasks, takeovers,
webhook deliveries) on ``--metrics-port`` (``PONDER_METRICS_PORT``).

The figures of a model carry its name in a ``model`` label (the queue depth, the engine's
rows and tokens/s, whether it is loaded): ``ponder`` without a models file.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["REGISTRY"]

REGISTRY = CollectorRegistry()

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

QUEUE_DEPTH = Gauge(
    "ponder_queue_depth",
    "Pending tasks by priority and model",
    ["priority", "model"],
    registry=REGISTRY,
)
TASKS_SUBMITTED = Counter(
    "ponder_tasks_submitted_total", "Tasks accepted by the API", ["mode"], registry=REGISTRY
)
TASKS_REJECTED = Counter(
    "ponder_tasks_rejected_total", "Submits refused", ["code"], registry=REGISTRY
)
TASKS_FINISHED = Counter(
    "ponder_tasks_finished_total", "Tasks by final status", ["status"], registry=REGISTRY
)
SAMPLE_LATENCY = Histogram(
    "ponder_sample_latency_seconds", "Sample latency", buckets=_LATENCY_BUCKETS, registry=REGISTRY
)
TOKENS_GENERATED = Counter(
    "ponder_completion_tokens_total", "Completion tokens generated", registry=REGISTRY
)
ENGINE_TOKENS_PER_S = Gauge(
    "ponder_engine_tokens_per_second",
    "Completion tokens/s of a model's engine (over the last second of steps, or the last batch)",
    ["model"],
    registry=REGISTRY,
)
ENGINE_ROWS = Gauge(
    "ponder_engine_rows",
    "Rows in a model's local engine by state (running, prefilling, queued)",
    ["state", "model"],
    registry=REGISTRY,
)
MODEL_LOADED = Gauge(
    "ponder_model_loaded",
    "1 while the model's engine is loaded in this worker process, 0 while it is not "
    "(loaded on its next task)",
    ["model"],
    registry=REGISTRY,
)
MODEL_LOADS = Counter(
    "ponder_model_loads_total",
    "Engine starts of a model in this worker process (the first, and each load on demand)",
    ["model"],
    registry=REGISTRY,
)
ENGINE_QUEUE_WAIT = Histogram(
    "ponder_engine_queue_wait_seconds",
    "Time a row waited in the engine's admission queue before it started",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
BATCH_SIZE = Histogram(
    "ponder_batch_size",
    "Requests per engine call",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
    registry=REGISTRY,
)
BATCH_WAIT = Histogram(
    "ponder_batch_wait_seconds",
    "Time a request waited in the batcher before its batch ran",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
BATCH_RUN = Histogram(
    "ponder_batch_run_seconds",
    "Engine time of one batch",
    buckets=_LATENCY_BUCKETS,
    registry=REGISTRY,
)
BATCH_PADDING = Histogram(
    "ponder_batch_padding_ratio",
    "Share of a batch's prompt slots that are padding",
    buckets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0),
    registry=REGISTRY,
)
BUFFER_DEPTH = Gauge(
    "ponder_batcher_buffer_depth",
    "Requests buffered in the batcher by priority",
    ["priority"],
    registry=REGISTRY,
)
ESCALATIONS = Counter(
    "ponder_escalations_total",
    "Auto tasks handed over to a stronger model (escalate_to), by the model they came from "
    "and the one they went to",
    ["from_model", "to_model"],
    registry=REGISTRY,
)
TASKS_RECLAIMED = Counter(
    "ponder_tasks_reclaimed_total",
    "Queue entries taken over from dead workers or lapsed leases",
    registry=REGISTRY,
)
OUTBOX_DEPTH = Gauge(
    "ponder_webhook_outbox_depth",
    "Webhook deliveries in the outbox (due, scheduled or being sent)",
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "ponder_webhook_deliveries_total",
    "Webhook delivery attempts by outcome",
    ["outcome"],
    registry=REGISTRY,
)
ENGINE_RESTARTS = Counter(
    "ponder_engine_restarts_total",
    "Engine process deaths and failed starts, each followed by a restart, by engine and "
    "reason (signal, exit, timeout, start_failed)",
    ["engine", "reason"],
    registry=REGISTRY,
)
ENGINE_UP = Gauge(
    "ponder_engine_up",
    "1 while the engine's process is live, 0 while it is down or restarting (engines "
    "with an engine process of their own: openvino)",
    ["engine"],
    registry=REGISTRY,
)
