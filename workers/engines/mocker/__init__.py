"""The simulated engine (Dynamo's mocker, in Python): ``engine`` (the scheduler loop and the requests),
``kv`` (its paged KV cache with prefix caching), ``timing`` (the published step-time model), ``tokens``
(the deterministic output), ``script`` (scripted failures for tests)."""
