"""The worker: claim tasks fairly across priorities, run their samples, finish them.

A task becomes samples; each sample is one row handed to the engine (which runs rows of
many tasks in one batch, joining and leaving per step). Only workers move a task forward
(pending → running → an end); every write is a compare-and-set on the task's revision,
so a cancel by the API is never overwritten: the worker hears of it at once (the store's
cancel notice) or at the next sample boundary, and stops using the engine for that task.
"""

from ponder.worker.loop import LoadStatus, Worker
from ponder.worker.task_run import SampleRunner, TaskAbandoned, TaskRun

__all__ = ["LoadStatus", "SampleRunner", "TaskAbandoned", "TaskRun", "Worker"]
