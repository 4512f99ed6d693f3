"""Guards on the third-party internals Sluice relies on.

Sluice uses a few things its libraries do not promise. Each has a test here that fails when an
upgrade changes it, with a message naming the library, its version and what to re-check
(:func:`tests.third_party.guard.drift`). pyproject.toml caps these libraries below their next minor
release, and requirements/lock*.txt pin the versions the tests ran on, so a guard normally fails
when someone raises a cap.

==============  =====================================================  ==============================  ==========================
library         internal                                               used in                         guard
==============  =====================================================  ==============================  ==========================
sse-starlette   ``EventSourceResponse._send_with_timeout``, called     app/api/sse.py                  test_sse_starlette.py
                for every event
celery, kombu   ``Consumer.on_send_event_buffered`` (wired by the      workers/consumer.py             test_celery.py
                ``Events`` bootstep), ``Consumer._flush_events``,
                the consumer's ``Hub.call_soon``/``call_later``
kombu           the Redis transport's keys for a queue (one list per   router/reaper.py via            test_kombu_redis.py
                priority, ``_kombu.binding*`` set members)             core/keys.py
vllm            ``AsyncLLM.is_sleeping()`` as an ordering barrier      workers/engines/vllm/engine.py  test_vllm.py (``-m vllm``)
                after ``abort``; ``reset_prefix_cache(
                reset_running_requests=True)``
transformers    ``PreTrainedModel.hf_quantizer``, set by the GGUF      workers/models/weights.py       test_transformers.py
                loader and checked by ``save_pretrained``                                              (``-m vllm``)
tokenizers      ``Tokenizer.encode_batch`` releases the GIL while it   app/model_card.py               test_tokenizers.py
                works (``encode`` holds it)
==============  =====================================================  ==============================  ==========================

vLLM's KV event wire format, mirrored by workers/engines/vllm/kv_events.py, is checked against
vLLM's own encoder in tests/workers/test_vllm_kv_events.py. The vLLM and transformers guards import
those libraries inside the tests, so the main environment still collects this package.
"""
