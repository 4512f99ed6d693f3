"""Raw NIXL throughput between two processes on this machine: the yardstick for KV transfer.

Usage (in the vLLM environment, where ``nixl`` is installed)::

    UCX_TLS=tcp,sm,self UCX_NET_DEVICES=lo .venv-vllm/bin/python -m bench.nixl_raw --mib 64 --desc-kib 48

A target process registers ``--mib`` MiB of host memory (DRAM) cut into descriptors of
``--desc-kib`` KiB (a KV transfer moves one descriptor per layer and block, so the descriptor size
matters as much as the total); an initiator process registers the same, exchanges agent metadata
with it over a pipe and READs the whole region ``--rounds`` times, one transfer request each, as
vLLM's NixlConnector does on the decode side. Each round's bytes are checked against the pattern
the target wrote, so a transfer that moved nothing cannot pass for a fast one.

:func:`measure` is what ``bench.disagg_bench`` calls to put the raw figure beside vLLM's own
transfer rate in the same run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

#: UCX needs TCP beside shared memory on loopback, or agent creation fails (no peer-failure handler).
UCX_LOOPBACK_ENV = {"UCX_TLS": "tcp,sm,self", "UCX_NET_DEVICES": "lo"}


@dataclass(frozen=True, slots=True)
class RawResult:
    total_bytes: int
    desc_bytes: int
    rounds: int
    gb_per_s_median: float
    gb_per_s_best: float
    seconds_median: float


def _region(nbytes: int, fill: int):  # noqa: ANN202 - numpy is imported lazily in the child
    import numpy as np

    if not fill:
        return np.zeros(nbytes, dtype=np.uint8)
    return np.resize(np.arange(256, dtype=np.uint8) ^ np.uint8(fill), nbytes)


def _descs(buf, desc_bytes: int) -> list[tuple[int, int, int]]:  # noqa: ANN001
    base = buf.ctypes.data
    return [(base + off, min(desc_bytes, buf.nbytes - off), 0) for off in range(0, buf.nbytes, desc_bytes)]


def _agent(name: str):  # noqa: ANN202
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=["UCX"]))


def _target(conn: Connection, nbytes: int, desc_bytes: int) -> None:
    agent = _agent("raw-target")
    buf = _region(nbytes, fill=0x5A)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    descs = agent.get_xfer_descs(_descs(buf, desc_bytes), "DRAM")
    conn.send((agent.get_agent_metadata(), agent.get_serialized_descs(descs)))
    conn.recv()  # the initiator is done


def _initiator(conn: Connection, nbytes: int, desc_bytes: int, rounds: int, out: Connection) -> None:
    import numpy as np

    agent = _agent("raw-initiator")
    buf = _region(nbytes, fill=0)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    local = agent.get_xfer_descs(_descs(buf, desc_bytes), "DRAM")
    metadata, serialized = conn.recv()
    peer = agent.add_remote_agent(metadata)
    remote = agent.deserialize_descs(serialized)
    expected = _region(nbytes, fill=0x5A)
    seconds: list[float] = []
    for _ in range(rounds + 1):  # the first round warms the connection up and is not counted
        buf[:] = 0
        handle = agent.initialize_xfer("READ", local, remote, peer)
        t0 = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        elapsed = time.perf_counter() - t0
        agent.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        if not np.array_equal(buf, expected):
            raise RuntimeError("NIXL transfer reported DONE but the bytes differ")
        seconds.append(elapsed)
    conn.send("done")
    out.send(seconds[1:])


def measure(total_bytes: int, desc_bytes: int, rounds: int = 5) -> RawResult:
    """READ ``total_bytes`` between two fresh processes ``rounds`` times; median and best GB/s."""
    os.environ.update({k: os.environ.get(k, v) for k, v in UCX_LOOPBACK_ENV.items()})
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    result_rx, result_tx = ctx.Pipe(duplex=False)
    target = ctx.Process(target=_target, args=(a, total_bytes, desc_bytes), daemon=True)
    initiator = ctx.Process(target=_initiator, args=(b, total_bytes, desc_bytes, rounds, result_tx), daemon=True)
    target.start()
    initiator.start()
    try:
        if not result_rx.poll(300):
            raise RuntimeError("the NIXL initiator did not report within 300 s")
        seconds: list[float] = result_rx.recv()
    finally:
        for proc in (initiator, target):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    med = statistics.median(seconds)
    return RawResult(total_bytes=total_bytes, desc_bytes=desc_bytes, rounds=rounds,
                     gb_per_s_median=total_bytes / med / 1e9, gb_per_s_best=total_bytes / min(seconds) / 1e9,
                     seconds_median=med)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="bytes moved per round, in MiB (default 64)")
    parser.add_argument("--desc-kib", type=int, default=48, help="descriptor size in KiB (default 48)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    args = parser.parse_args()
    result = measure(args.mib << 20, args.desc_kib << 10, args.rounds)
    for key, value in asdict(result).items():
        print(f"{key:>16}: {value}")


if __name__ == "__main__":
    main()
