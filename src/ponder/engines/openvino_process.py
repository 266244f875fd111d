"""The engine process: OpenVINO GenAI's continuous-batching pipeline, driven over a pipe.

The openvino engine (``engines/openvino.py``) runs this file as a program of its own
(``python openvino_process.py FD``), as vLLM v1 runs its EngineCore, so a native fault in
the model library (a SIGFPE, an abort) ends this process alone. The engine keeps ponder's
scheduling (admission by fair share, preemption, time limits, stop strings, streaming
text); this process only runs the model. It is started by path, not as a module of the
package: it imports nothing of ponder (numpy and OpenVINO alone), and nothing of the
parent's ``__main__``. It ignores SIGINT and SIGTERM: the engine ends it (``close``, or
its end of the socket closing), so a Ctrl-C of the service, or a SIGTERM to its process
group, reaches the service alone, which stops its rows and then ends this process.

The protocol, one request and one answer at a time over a
:class:`multiprocessing.connection.Connection` on the socket FD it inherits:

- the engine's first message is the pipeline's configuration; this side answers
  ``("ready", {})``, or ``("error", message)`` when the pipeline cannot be built (then it
  exits);
- ``("step", adds, drops)``: ``drops`` are request ids to end now (cancelled, stopped by a
  stop string, preempted); ``adds`` are ``(request_id, token_ids, params)`` to start; then
  one pipeline step (prefill for newcomers, a decode token for running rows, as the
  pipeline schedules them). Answer ``("step", produced, ended)``: ``produced`` maps a
  request id to ``(token_ids, logprobs)`` generated in that step, ``ended`` maps the ids
  the pipeline ended to why (``"finished"``, or ``"ignored"``: it could not schedule the
  request, e.g. a prompt larger than the KV cache). ``("failed", message, suspects)`` when
  the step raised: every request is stopped and one more step releases them (the pipeline
  recovers only so: a failed step leaves its requests mid-step); ``suspects``
  are the requests whose schema (``params["json_schema"]``) had not yet let a request
  generate a token: the pipeline compiles a schema's grammar when it first samples for it,
  and a schema it cannot compile (e.g. a ``pattern`` with a lookahead) fails that step;
- ``("close",)``: exit.

Ending, by ``close`` or by the engine's end of the socket closing (its process died), this
side stops the requests it still runs and steps the pipeline once more, so that their KV
blocks are released before the pipeline is destroyed (else OpenVINO GenAI's block manager
reports them leaked on stderr), and exits with code 0 without a word: a closed socket
(``EOFError``, ``BrokenPipeError``) is the engine's way of saying it went away.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["serve"]


def main() -> None:
    # Ctrl+C and a SIGTERM sent to the whole process group (make, a terminal, a container
    # runtime) are for the service, which ends this process when it has stopped its rows
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(sys.argv[1]))
    try:
        serve(conn, conn.recv())
    except (EOFError, OSError):  # the engine went away: nobody is left to answer
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.close()


def serve(conn: Connection, config: dict[str, Any]) -> None:
    """Build the pipeline from ``config`` and answer the engine until it closes."""
    try:
        import numpy
        import openvino
        import openvino_genai as genai

        pipe = _pipeline(genai, config)
    except Exception as e:
        conn.send(("error", " ".join(f"{type(e).__name__}: {e}".split())))
        return
    handles: dict[int, Any] = {}
    try:
        conn.send(("ready", {}))
        _answer(conn, pipe, handles, genai, numpy, openvino)
    finally:
        _release(pipe, handles)


def _release(pipe: Any, handles: dict[int, Any]) -> None:
    """Stop the requests still running and let one more step free their KV blocks."""
    if not handles:
        return
    for handle in handles.values():
        handle.stop()
    handles.clear()
    with contextlib.suppress(Exception):
        pipe.step()


def _answer(
    conn: Connection, pipe: Any, handles: dict[int, Any], genai: Any, numpy: Any, openvino: Any
) -> None:
    """Answer the engine's steps until it closes (or goes away: EOFError, OSError)."""
    running = genai.GenerationStatus.RUNNING
    ignored = genai.GenerationStatus.IGNORED
    #: the schema of each structured request; the schemas that let a request generate
    schemas: dict[int, str] = {}
    compiled: set[str] = set()
    while True:
        message = conn.recv()
        if message[0] == "close":
            return
        _, adds, drops = message
        for request_id in drops:
            handle = handles.pop(request_id, None)
            schemas.pop(request_id, None)
            if handle is not None:
                handle.stop()
        try:
            for request_id, ids, params in adds:
                if params.get("json_schema") is not None:
                    schemas[request_id] = params["json_schema"]
                tensor = openvino.Tensor(numpy.asarray([ids], dtype=numpy.int64))
                handles[request_id] = pipe.add_request(
                    request_id, tensor, _generation_config(genai, params)
                )
            pipe.step()
        except Exception as e:
            _release(pipe, handles)  # stopped, and one more step frees them
            suspects = [rid for rid, schema in schemas.items() if schema not in compiled]
            schemas.clear()
            conn.send(("failed", " ".join(f"{type(e).__name__}: {e}".split()), suspects))
            continue
        produced: dict[int, tuple[list[int], list[float]]] = {}
        ended: dict[int, str] = {}
        for request_id, handle in list(handles.items()):
            if handle.can_read():
                for output in handle.read().values():  # one sequence per request
                    produced[request_id] = (
                        list(output.generated_ids),
                        list(output.generated_log_probs),
                    )
                if request_id in schemas:
                    compiled.add(schemas[request_id])
            status = handle.get_status()
            if status != running and not handle.can_read():
                del handles[request_id]
                schemas.pop(request_id, None)
                ended[request_id] = "ignored" if status == ignored else "finished"
        conn.send(("step", produced, ended))


def _pipeline(genai: Any, config: dict[str, Any]) -> Any:
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 0
    scheduler.num_kv_blocks = config["kv_blocks"]
    scheduler.max_num_seqs = config["max_rows"]
    scheduler.max_num_batched_tokens = config["step_tokens"]
    scheduler.dynamic_split_fuse = True
    scheduler.enable_prefix_caching = config["prefix_caching"]
    # f32 compute and an f32 KV cache: the CPU plugin's defaults (bf16 where the CPU has it,
    # a u8 KV cache) change a small model's greedy answers (SmolLM2: 47 of 50 short
    # answers as float32's with the u8 or f16 cache, 48 with f32)
    properties: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    if config["threads"] > 0:
        properties["INFERENCE_NUM_THREADS"] = config["threads"]
    return genai.ContinuousBatchingPipeline(config["path"], scheduler, "CPU", properties)


def _generation_config(genai: Any, params: dict[str, Any]) -> Any:
    generation = genai.GenerationConfig()
    generation.max_new_tokens = params["max_new_tokens"]
    generation.stop_token_ids = set(params["eos_ids"])
    generation.logprobs = 1
    if params["temperature"] > 0:
        generation.do_sample = True
        generation.temperature = params["temperature"]
        generation.top_p = params["top_p"]
        generation.rng_seed = params["seed"]
    if params.get("json_schema") is not None:
        # xgrammar in the pipeline: this request's tokens are masked to its own schema,
        # whatever the other requests of the batch are constrained to (or not)
        generation.structured_output_config = genai.StructuredOutputConfig(
            json_schema=params["json_schema"]
        )
    return generation


if __name__ == "__main__":
    main()
