"""The floor of the card's shape: the least any FastAPI + Celery + Redis pub/sub request plane can cost.

``make bench-dynamo`` (``bench.frontend_bench --floor``) measures two servers next to Sluice and Dynamo,
under the same load, to show which of the efficiency targets the parts themselves allow:

- ``floor: http`` (:mod:`bench.floor.frontend` without Redis): uvicorn (uvloop, httptools) and one
  FastAPI route that reads the JSON body and streams the 16 chunks, the usage chunk and ``[DONE]``
  from pre-encoded bytes. No validation, tokenizer, routing, queue or pub/sub: what remains is the
  HTTP server and the framework, a lower bound for any frontend built on them.
- ``floor: celery`` (the same frontend with ``FLOOR_REDIS_URL``, and :mod:`bench.floor.worker`): each
  request is ``LPUSH``ed as a Celery protocol-2 message onto one queue, a stock Celery worker (threads
  pool, no task events, no results) runs a task that answers with **one** ``PUBLISH`` carrying all the
  request's tokens, and the frontend's one shared subscription hands it to the waiting response. No
  engine, no KV index, no tokens over time: a lower bound for a platform whose requests travel as
  Celery tasks and whose tokens come back over Redis pub/sub.
"""
