"""KV transfer between two vLLM engines against raw NIXL: `python -m bench.vllm_transfer_bench`
(in the vLLM environment; `make bench-disagg` runs it).

Two vLLM engines on the default model (each with its own engine-core process and NIXL agent, vLLM's
NixlConnector, as Sluice's prefill and decode workers run them): each round prefills a new prompt of
``--tokens`` tokens on the prefill engine (``kv_export``), then gives its transfer handle to the
decode engine, whose connector READs the prompt's blocks. The decode engine's connector telemetry
(``NixlKVConnectorStats``: bytes, descriptors, seconds from post to completion, per transfer) gives
vLLM's transfer rate. In the same run, raw NIXL (bench.nixl_raw) moves the same bytes in
descriptors of the same size between two processes. Prints a table; writes
bench/results/vllm_transfer.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import nixl_raw
from core.messages import SamplingParams
from core.settings import Settings, VllmSettings
from workers.engines.base import EngineRequest
from workers.engines.vllm.engine import VllmEngine
from workers.engines.vllm.kv_transfer import KvTransferSetup, free_port
from workers.models.prepare import prepare_model

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "smollm2"


@dataclass(frozen=True, slots=True)
class Transfer:
    prompt_tokens: int
    transferred_tokens: int
    bytes: int
    descriptors: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9


async def _run(engine: VllmEngine, request: EngineRequest) -> list:
    return [out async for out in engine.generate(request)]


async def _rounds(args: argparse.Namespace) -> list[Transfer]:
    settings = VllmSettings(max_num_seqs=4, kv_cache_gib=args.kv_gib, omp_threads=args.threads)
    host = "127.0.0.1"
    weights = prepare_model(MODEL, Settings().models_dir, weights=True, progress=False)
    prefill = VllmEngine(MODEL, weights, settings, transfer=KvTransferSetup(host, free_port(host), 30))
    await prefill.start()
    decode = VllmEngine(MODEL, weights, settings, transfer=KvTransferSetup(host, free_port(host), 30))
    await decode.start()
    transfers = []
    try:
        vocab = prefill.info.vocab_size
        for i in range(args.rounds + 1):  # the first round is a warm-up (the handshake happens there)
            prompt = [(7919 * (i * args.tokens + k) + 13) % (vocab - 100) + 50 for k in range(args.tokens)]
            sampling = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
            rid = uuid.uuid4().hex
            one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)  # what the host asks of a prefill
            outs = await _run(prefill, EngineRequest(rid, prompt, one, kv_export=True))
            handle, first = outs[-1].kv_handle, [t for o in outs for t in o.token_ids]
            before = decode.counters.kv_reads, decode.counters.kv_read_bytes, decode.counters.kv_read_seconds, \
                decode.counters.kv_read_descriptors
            outs = await _run(decode, EngineRequest(rid, [*prompt, *first], sampling, kv_handle=handle,
                                                    carried_tokens=len(first)))
            await asyncio.sleep(0.5)  # the step that reports the read's telemetry may follow the output
            c = decode.counters
            if c.kv_reads == before[0]:
                raise RuntimeError(f"round {i}: the decode engine reported no KV read ({c})")
            if i == 0:
                continue
            usage = outs[-1].usage
            transfers.append(Transfer(len(prompt), usage.transferred_tokens if usage else 0,
                                      c.kv_read_bytes - before[1], c.kv_read_descriptors - before[3],
                                      c.kv_read_seconds - before[2]))
    finally:
        await decode.shutdown()
        await prefill.shutdown()
    return transfers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prompt tokens per round (default 4096)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after one warm-up (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per engine (default 1)")
    parser.add_argument("--kv-gib", type=float, default=1.0, help="KV cache per engine, GiB (default 1)")
    args = parser.parse_args()
    os.environ.update({k: v for k, v in nixl_raw.UCX_LOOPBACK_ENV.items() if k not in os.environ})
    transfers = asyncio.run(_rounds(args))
    size = int(statistics.median(t.bytes for t in transfers))
    desc = max(1, size // max(1, int(statistics.median(t.descriptors for t in transfers))))
    raw = nixl_raw.measure(size, desc, rounds=args.rounds)
    vllm_median = statistics.median(t.gb_per_s for t in transfers)
    vllm_best = max(t.gb_per_s for t in transfers)
    table = Table(title=f"KV transfer, vLLM NixlConnector vs raw NIXL ({size / 2**20:.1f} MiB per transfer, "
                        f"{desc / 1024:.1f} KiB descriptors, loopback)")
    for col in ("path", "GB/s median", "GB/s best", "transfers"):
        table.add_column(col, justify="right")
    table.add_row("vLLM decode engine reads", f"{vllm_median:.2f}", f"{vllm_best:.2f}", str(len(transfers)))
    table.add_row("raw NIXL, same bytes", f"{raw.gb_per_s_median:.2f}", f"{raw.gb_per_s_best:.2f}", str(raw.rounds))
    console = Console()
    console.print(table)
    ratio = vllm_median / raw.gb_per_s_median
    console.print(f"vLLM / raw (medians): {ratio:.2f}x; target >= 0.8x")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vllm_transfer.json").write_text(json.dumps({
        "args": vars(args), "transfers": [{**asdict(t), "gb_per_s": t.gb_per_s} for t in transfers],
        "raw": asdict(raw), "ratio_median": ratio}, indent=2))

if __name__ == "__main__":
    main()
