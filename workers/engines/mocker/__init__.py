"""The simulated engine (Dynamo's mocker, in Python): ``spec`` (what it declares: workers.engines.spec),
``build`` (its builder), ``engine`` (the Engine API: streams, validation,
LoRA, lifecycle), ``scheduler`` (the queues, admission and the step loop), ``transfer`` (KV held for and
read from another worker in disaggregated serving), ``request`` (a request's state, shared by the three),
``kv`` (its paged KV cache with prefix caching), ``timing`` (the published step-time model), ``tokens``
(the deterministic output), ``script`` (scripted outputs for tests)."""
