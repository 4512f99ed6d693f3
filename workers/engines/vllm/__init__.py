"""The vLLM engine adapter: ``spec`` (what it declares: workers.engines.spec), ``build`` (its builder),
``engine`` (AsyncLLM behind Sluice's Engine interface), ``kv_events`` and ``kv_subscriber`` (vLLM's KV
cache events as Sluice block hashes), ``kv_transfer`` (the NixlConnector set-up for disaggregation),
``stats`` (vLLM's iteration details as the worker's step timings). Nothing here but ``spec`` is
imported unless a vLLM worker starts: vLLM and torch are heavy."""
