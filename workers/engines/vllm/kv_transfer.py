"""KV transfer between vLLM workers with vLLM's own ``NixlConnector`` (docs/disaggregation.md).

A vLLM worker of the ``prefill`` or ``decode`` pool starts its engine with the connector
(:func:`transfer_config`) and a NIXL side channel of its own (:func:`configure_environment`: the
address decode workers connect to, read by vLLM's engine core from the environment). The request
protocol is vLLM's:

* the prefill carries ``kv_transfer_params={"do_remote_decode": True}`` (:func:`export_params`); its
  last output returns the handle (``remote_engine_id``, ``remote_block_ids``, ``remote_host``,
  ``remote_port``, ...), and vLLM keeps the blocks until the decode worker has read them or the
  lease (``kv_lease_duration``) ends;
* the decode passes the handle back (:func:`import_params`). Sluice's decode prompt is the prompt
  plus the prefill's first token, so that token stays the one the client already has (vLLM's own
  proxy instead sends the bare prompt and samples the first token again on the decode side). The
  decode side allocates blocks for one token more than the prefill computed; when the prompt fills
  its last block exactly that is one block more than the handle names, and vLLM's connector
  requires the handle to cover every block it allocates. The handle is padded with the last block
  again: the padding block's content is never used, since vLLM recomputes the last token of a
  loaded prompt (here the first token), writing its KV over the padding.

A read that fails (the prefill worker gone, a timeout) is recomputed locally
(``kv_load_failure_policy="recompute"``): the request does not fail for it.

With KV tiers on (``settings.kvbm``, docs/kvbm.md) the engine also runs Sluice's own connector
(workers.engines.vllm.kvbm_connector, :func:`kvbm_config`); a prefill or decode worker composes both
through vLLM's ``MultiConnector`` (:func:`connector_config`), NIXL first: a decode's transfer wins over
a tier hit, and every computed block is offered to both (NIXL ignores what it was not asked to send).
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig

    from core.settings import KvbmSettings

#: UCX on a machine without RDMA: loopback TCP and shared memory (NIXL's agent creation fails with
#: ``sm,self`` alone). Only defaults: an operator's own UCX settings win.
_CPU_UCX_ENV = {"UCX_TLS": "tcp,sm,self", "UCX_NET_DEVICES": "lo"}


@dataclass(frozen=True, slots=True)
class KvTransferSetup:
    """Where this worker's NIXL side channel listens (decode workers connect there) and how long it
    keeps a prompt's blocks for a decode worker that has not read them yet."""

    host: str
    port: int
    lease_s: float


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (the side channel binds it when the engine starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def configure_environment(setup: KvTransferSetup, on_cpu: bool) -> None:
    """vLLM's engine core reads its side-channel address (and UCX its transports) from the
    environment of the process it spawns: set them before the engine starts."""
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = setup.host
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(setup.port)
    if on_cpu:
        for key, value in _CPU_UCX_ENV.items():
            os.environ.setdefault(key, value)


def transfer_config(setup: KvTransferSetup, on_cpu: bool) -> KVTransferConfig:
    from vllm.config import KVTransferConfig  # the pure helpers above and below work without vLLM

    return KVTransferConfig(**_nixl_fields(setup, on_cpu), kv_load_failure_policy="recompute")


def _nixl_fields(setup: KvTransferSetup, on_cpu: bool) -> dict[str, Any]:
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_buffer_device": "cpu" if on_cpu else "cuda",
        "kv_connector_extra_config": {"kv_lease_duration": max(1, math.ceil(setup.lease_s))},
    }


@dataclass(frozen=True, slots=True)
class KvbmSetup:
    """Sluice's KV tiers for this engine: their settings, the model name block hashes are salted with
    (router.hashing), and the socket (an abstract Unix address with a key of its own) on which the
    engine's worker process answers questions about them (workers.engines.vllm.kvbm_connector)."""

    settings: KvbmSettings
    model: str
    address: str
    key: str

    @classmethod
    def new(cls, settings: KvbmSettings, model: str) -> KvbmSetup:
        return cls(settings, model, f"\0sluice-kvbm-{uuid.uuid4().hex}", secrets.token_hex(16))


def _kvbm_fields(setup: KvbmSetup) -> dict[str, Any]:
    from workers.engines.vllm import kvbm_connector as connector

    return {
        "kv_connector": "SluiceKvbmConnector",
        "kv_connector_module_path": connector.__name__,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            connector.EXTRA_MODEL: setup.model,
            connector.EXTRA_SETTINGS: setup.settings.model_dump(mode="json"),
            connector.EXTRA_ADDRESS: setup.address,
            connector.EXTRA_KEY: setup.key,
        },
    }


def connector_config(transfer: KvTransferSetup | None, kvbm: KvbmSetup | None, on_cpu: bool) -> KVTransferConfig | None:
    """The engine's ``kv_transfer_config``: NIXL for the prefill/decode pools, the tiers' connector with
    tiers on, both through ``MultiConnector`` (NIXL first), or None (no connector: the default)."""
    from vllm.config import KVTransferConfig

    if kvbm is None:
        return transfer_config(transfer, on_cpu) if transfer is not None else None
    if transfer is None:
        return KVTransferConfig(**_kvbm_fields(kvbm), kv_load_failure_policy="recompute")
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config={"connectors": [_nixl_fields(transfer, on_cpu), _kvbm_fields(kvbm)]},
    )


def export_params() -> dict[str, Any]:
    """``kv_transfer_params`` of a prefill whose KV a decode worker will read."""
    return {"do_remote_decode": True}


def import_params(handle: dict[str, Any], num_tokens: int, block_size: int) -> dict[str, Any]:
    """``kv_transfer_params`` of a decode of ``num_tokens`` tokens (prompt + first token) reading
    the KV that ``handle`` names; the handle's block lists padded as the module docstring says."""
    params = dict(handle)
    # vLLM would report the prefill worker's prefix hit as the decode's cached tokens; Sluice counts
    # the decode's own (its usage splits them from the transferred ones).
    params.pop("remote_prefill_cached_tokens", None)
    needed = math.ceil(num_tokens / block_size)
    groups = params.get("remote_block_ids") or []
    params["remote_block_ids"] = [_padded(list(group), needed) for group in groups]
    return params


def _padded(block_ids: list[int], needed: int) -> list[int]:
    if not block_ids or len(block_ids) >= needed:
        return block_ids
    return block_ids + [block_ids[-1]] * (needed - len(block_ids))
