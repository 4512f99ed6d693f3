"""The pools a worker can serve in, and what each one does.

A worker joins one pool (``SLUICE_WORKER__POOL``, ``sluice worker --pool``); routing and the workers
ask a pool what it does, never its name::

    Pool.PREFILL.serves_clients        # False: it computes prompts for other workers
    Pool("decode").transfers_kv        # True: its prompts' KV arrives from a prefill worker

Adding a pool is adding one member here: its name and its capabilities, side by side. The name is what
a worker registers: a router of an older release that reads a pool name it does not know (``Pool(name)``
raises ValueError) leaves that worker out (router.registry) rather than guess what it does.
"""

from __future__ import annotations

import enum


class Pool(enum.StrEnum):
    #: name, serves_clients, prefills_for_others, decodes_handoffs
    AGG = "agg", True, False, False
    PREFILL = "prefill", False, True, False
    DECODE = "decode", True, False, True

    #: Its workers answer clients' requests (streams come from them): a model is served once one is up.
    serves_clients: bool
    #: Its workers compute prompts for other workers and hand the KV over.
    prefills_for_others: bool
    #: Its workers decode requests whose prompt another worker computed (their KV arrives over NIXL).
    decodes_handoffs: bool

    def __new__(cls, name: str, serves_clients: bool, prefills_for_others: bool, decodes_handoffs: bool) -> Pool:
        member = str.__new__(cls, name)
        member._value_ = name
        member.serves_clients = serves_clients
        member.prefills_for_others = prefills_for_others
        member.decodes_handoffs = decodes_handoffs
        return member

    @property
    def transfers_kv(self) -> bool:
        """Its engine must move KV between workers (vLLM's NixlConnector)."""
        return self.prefills_for_others or self.decodes_handoffs
