"""OpenAI's APIs on ponder's tasks: chat completions, the Responses API, Files and Batches
(the routes are thin modules of :mod:`ponder.api`; this package holds no HTTP).

- :mod:`~ponder.openai.common`: OpenAI's error shape, model names → modes, text content,
  submitting a task (:mod:`ponder.admission`, its refusals in OpenAI's shape), usage;
- :mod:`~ponder.openai.chat`: a chat completion request → a task, a task → the completion;
- :mod:`~ponder.openai.responses`: a response request → a task, a task → the response
  object, a task's event log → the response's stream events;
- :mod:`~ponder.openai.files`: the Files API's records and contents;
- :mod:`~ponder.openai.batches`: batch objects, input checks, output lines;
- :mod:`~ponder.openai.batch_feeder`: runs batches beside the workers (``WorkerRuntime``)
  and queues the webhooks of ended background responses and batches;
- :mod:`~ponder.openai.webhooks`: those webhooks in OpenAI's shape, through the outbox.

Inside the package imports are absolute (``ponder.openai.…``): the name ``openai`` at the
top level is OpenAI's SDK.
"""
