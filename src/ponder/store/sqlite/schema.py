"""The SQLite store's tables, and the statements that create and purge them."""

from __future__ import annotations

import aiosqlite

__all__ = [
    "ADDED_COLUMNS",
    "EXPIRED",
    "INDEXES",
    "LIVE",
    "OBJECTS_SCHEMA",
    "SCHEMA",
    "create_schema",
    "purge_expired",
]

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL,
    sort_key TEXT NOT NULL,
    rev INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL,
    lane TEXT,
    model TEXT NOT NULL DEFAULT 'ponder',
    deadline REAL
);
CREATE INDEX IF NOT EXISTS tasks_by_owner ON tasks (owner, sort_key);
CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, priority);
CREATE INDEX IF NOT EXISTS tasks_by_expiry ON tasks (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS queue (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    priority INTEGER NOT NULL,
    consumer TEXT,
    claimed_at REAL,
    model TEXT NOT NULL DEFAULT 'ponder'
);
CREATE INDEX IF NOT EXISTS queue_claimed ON queue (claimed_at) WHERE consumer IS NOT NULL;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    event TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_task ON events (task_id, id);
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    body_hash TEXT NOT NULL,
    task_id TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE TABLE IF NOT EXISTS workers (
    id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    models TEXT
);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    due_at REAL NOT NULL,
    owner TEXT,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (due_at);
CREATE TABLE IF NOT EXISTS outbox_once (id TEXT PRIMARY KEY, expires_at REAL NOT NULL);
"""

OBJECTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    kind TEXT NOT NULL,
    id TEXT NOT NULL,
    owner TEXT NOT NULL,
    sort_key TEXT NOT NULL,
    rev INTEGER NOT NULL,
    active INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (kind, id)
);
CREATE INDEX IF NOT EXISTS objects_by_owner ON objects (kind, owner, sort_key);
CREATE INDEX IF NOT EXISTS objects_active ON objects (kind, sort_key) WHERE active = 1;
CREATE TABLE IF NOT EXISTS blobs (
    key TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS parts (
    key TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data TEXT NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (key, idx)
);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""

#: the columns added since the first schema, by table: a file made before them gets them
#: (with their defaults: the tasks and queue entries of a file from before there were
#: models are the default model's)
ADDED_COLUMNS = {
    "tasks": {"lane": "TEXT", "model": "TEXT NOT NULL DEFAULT 'ponder'", "deadline": "REAL"},
    "queue": {"model": "TEXT NOT NULL DEFAULT 'ponder'"},
    "workers": {"models": "TEXT"},
}

#: the indexes over added columns (made once the columns are there)
INDEXES = """
DROP INDEX IF EXISTS queue_ready;
CREATE INDEX IF NOT EXISTS queue_ready_by_model ON queue (model, priority, id)
    WHERE consumer IS NULL;
CREATE INDEX IF NOT EXISTS tasks_by_deadline ON tasks (deadline)
    WHERE status = 'pending' AND deadline IS NOT NULL;
"""

#: a task row that has not expired (takes the time as a parameter)
LIVE = "(expires_at IS NULL OR expires_at > ?)"
#: the ids of the expired tasks (takes the time as a parameter)
EXPIRED = "SELECT id FROM tasks WHERE expires_at <= ?"


async def create_schema(db: aiosqlite.Connection) -> None:
    """Every table and index, and the :data:`ADDED_COLUMNS` a file made before them lacks."""
    await db.executescript(SCHEMA)
    await db.executescript(OBJECTS_SCHEMA)
    for table, added in ADDED_COLUMNS.items():
        columns = {row[1] for row in await db.execute_fetchall(f"PRAGMA table_info({table})")}
        for name, declared in added.items():
            if name not in columns:
                await db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declared}")
    await db.executescript(INDEXES)


async def purge_expired(db: aiosqlite.Connection, now: float) -> None:
    """Delete the expired rows of every table (a task's events and queue entries with it)."""
    for table in ("events", "queue"):
        await db.execute(f"DELETE FROM {table} WHERE task_id IN ({EXPIRED})", (now,))
    for table in ("tasks", "idempotency", "workers", "outbox", "outbox_once"):
        await db.execute(f"DELETE FROM {table} WHERE expires_at <= ?", (now,))
    for table in ("objects", "blobs", "parts", "leases"):
        await db.execute(f"DELETE FROM {table} WHERE expires_at <= ?", (now,))
