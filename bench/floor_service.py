"""The floor of ponder's shape: a task service on ponder's stack that does nothing else.

``bench/overhead.py``'s *floor* part runs it beside ponder, through the same client and
the same redis-server, to tell the stack's own cost per task from ponder's work:

- ``python bench/floor_service.py api PORT REDIS_URL PREFIX``: FastAPI on uvicorn
  (httptools, uvloop: as ``ponder api``). ``POST /v1/tasks`` validates the body with a
  pydantic model and stores the task in one Lua script (its record, a queue entry that
  carries it, its first event), answering 202 with the record; ``GET /v1/tasks/{id}``
  answers the stored record as it is (one HGET, no parsing).
- ``python bench/floor_service.py worker REDIS_URL PREFIX SLOTS``: SLOTS loops, each
  claiming one entry with XREADGROUP BLOCK, then ending the task in one Lua script (the
  record ``done``, a ``result`` event, the entry acked and deleted).

Per task: two HTTP requests, four Redis round trips, the record parsed and written twice;
no engine, no events beyond two, no vote, no validation beyond the body's model, no
owners, limits, metrics or webhooks. Stopped by SIGTERM.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import signal
import sys
from typing import Any

import uvicorn
import uvloop
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.asyncio import Redis

GROUP = "floor"

CREATE = """
redis.call('HSET', KEYS[1], 'data', ARGV[2])
redis.call('XADD', KEYS[2], '*', 'task', ARGV[1], 'data', ARGV[2])
redis.call('XADD', KEYS[3], '*', 'event', 'status', 'data', '{"status":"pending"}')
return 1
"""

FINISH = """
redis.call('HSET', KEYS[1], 'data', ARGV[1])
redis.call('XADD', KEYS[2], '*', 'event', 'result', 'data', ARGV[1])
redis.call('XACK', KEYS[3], ARGV[2], ARGV[3])
redis.call('XDEL', KEYS[3], ARGV[3])
return 1
"""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class TaskCreate(BaseModel):
    prompt: str
    mode: str = "fast"


def api(port: int, url: str, prefix: str) -> None:
    redis = Redis.from_url(url, decode_responses=True)
    create = redis.register_script(CREATE)
    app = FastAPI()
    ids = iter(range(1 << 62))
    pid = os.getpid()

    @app.post("/v1/tasks", status_code=202)
    async def submit(body: TaskCreate) -> JSONResponse:
        task_id = f"{pid}-{next(ids)}"
        record = {"id": task_id, "status": "pending", "created_at": now(), **body.model_dump()}
        data = json.dumps(record)
        keys = [f"{prefix}:task:{task_id}", f"{prefix}:q", f"{prefix}:ev:{task_id}"]
        await create(keys=keys, args=[task_id, data])
        return JSONResponse(record, status_code=202)

    @app.get("/v1/tasks/{task_id}")
    async def get(task_id: str) -> Response:
        data = await redis.hget(f"{prefix}:task:{task_id}", "data")
        if data is None:
            return JSONResponse({"error": "not found"}, status_code=404)
        return Response(data, media_type="application/json")

    @app.get("/readyz")
    async def ready() -> dict[str, int]:
        return {"workers": int(await redis.get(f"{prefix}:workers") or 0)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", loop="uvloop",
                http="httptools")  # fmt: skip


async def worker(url: str, prefix: str, slots: int) -> None:
    redis = Redis.from_url(url, decode_responses=True)
    finish = redis.register_script(FINISH)
    queue = f"{prefix}:q"
    try:
        await redis.xgroup_create(queue, GROUP, id="0", mkstream=True)
    except Exception as e:  # BUSYGROUP: made by an earlier run
        if "BUSYGROUP" not in str(e):
            raise
    await redis.incr(f"{prefix}:workers")

    async def loop(consumer: str) -> None:
        while True:
            reply: Any = await redis.xreadgroup(GROUP, consumer, {queue: ">"}, count=1, block=1000)
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    task = json.loads(fields["data"])
                    task.update(status="done", finished_at=now(), samples_done=1,
                                result={"answer": "4"})  # fmt: skip
                    keys = [f"{prefix}:task:{task['id']}", f"{prefix}:ev:{task['id']}", queue]
                    await finish(keys=keys, args=[json.dumps(task), GROUP, entry_id])

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    loops = [asyncio.create_task(loop(f"c{i}")) for i in range(slots)]
    await stop.wait()
    for task in loops:
        task.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    await redis.aclose()


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "api":
        api(int(args[0]), args[1], args[2])
    else:
        uvloop.run(worker(args[0], args[1], int(args[2])))
