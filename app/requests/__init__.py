"""The request plane on the frontend: a request's life (``generation``: plan, stream, migration),
its choices (``choices``), the token streams from the workers over one pub/sub connection
(``streams``), the pipelined enqueue (``enqueue``), admission control (``admission``) and what a
finished request leaves behind (``observer``)."""
