"""KV tiers below an engine's device cache: host memory, local disk and a shared Redis (docs/kvbm.md).

:class:`~workers.kvbm.tiers.KvTiers` is what an engine uses: it offloads full blocks in the background,
says how much of a prompt's chain some tier holds, and onboards that run, verified. The tiers themselves
(``host``, ``disk``, ``shared``) each keep one job: a byte budget and where the bytes live.
"""
