"""The planner's optional traffic source: the frontends' metrics as a Prometheus server has them
(``SLUICE_PLANNER__SOURCE=prometheus``, ``SLUICE_PLANNER__PROMETHEUS_URL``), for deployments that already
scrape them; the pools are still read from the workers' leases.

Each interval it asks, per model, for the increase over the interval of the frontends' counters
(docs/metrics.md): requests (``sluice_requests_total``: all of them for the rate, those that did not fail
for the means), prompt and generated tokens, the decode's context, and the sums and counts of the TTFT and ITL histograms.
Prometheus counts requests as they finish (the frontends' own counters count them as they arrive), so
its rate trails a ramp by a request's duration. One HTTP round trip per query, concurrently.
"""

from __future__ import annotations

import asyncio

import httpx

from planner.observe import TrafficSample

#: PromQL per quantity (``{w}``: the window in seconds), each summed per model over every frontend process.
QUERIES = {
    "arrived": "sum by (model) (increase(sluice_requests_total[{w}s]))",
    "finished": 'sum by (model) (increase(sluice_requests_total{{outcome!="error"}}[{w}s]))',
    "input": "sum by (model) (increase(sluice_input_tokens_total[{w}s]))",
    "output": "sum by (model) (increase(sluice_output_tokens_total[{w}s]))",
    "context": "sum by (model) (increase(sluice_decode_context_tokens_total[{w}s]))",
    "ttft_sum": "sum by (model) (increase(sluice_time_to_first_token_seconds_sum[{w}s]))",
    "ttft_n": "sum by (model) (increase(sluice_time_to_first_token_seconds_count[{w}s]))",
    "itl_sum": "sum by (model) (increase(sluice_inter_token_latency_seconds_sum[{w}s]))",
    "itl_n": "sum by (model) (increase(sluice_inter_token_latency_seconds_count[{w}s]))",
}


class PrometheusError(RuntimeError):
    """Prometheus did not answer a query, or answered an error."""


class PrometheusTraffic:
    def __init__(self, url: str, client: httpx.AsyncClient | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.AsyncClient(timeout=timeout_s)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def _query(self, expr: str) -> dict[str, float]:
        try:
            r = await self.client.get(f"{self.url}/api/v1/query", params={"query": expr})
        except httpx.HTTPError as exc:
            raise PrometheusError(f"Prometheus at {self.url} did not answer: {exc}") from exc
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        if r.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused {expr!r}: {r.status_code} {body.get('error', r.text[:200])}")
        return {item["metric"].get("model", ""): float(item["value"][1]) for item in body["data"]["result"]}

    async def read(self, window_s: float) -> dict[str, TrafficSample]:
        """Each model's traffic over the last ``window_s`` seconds."""
        w = max(1, round(window_s))
        names = list(QUERIES)
        answers = await asyncio.gather(*(self._query(QUERIES[n].format(w=w)) for n in names))
        by = dict(zip(names, answers, strict=True))
        out = {}
        for model in by["arrived"]:
            v = {name: by[name].get(model, 0.0) for name in names}
            finished = v["finished"]
            out[model] = TrafficSample(
                duration_s=float(w), arrived=round(v["arrived"]), finished=round(finished),
                isl=v["input"] / finished if finished else None, osl=v["output"] / finished if finished else None,
                ttft_s=v["ttft_sum"] / v["ttft_n"] if v["ttft_n"] else None,
                itl_s=v["itl_sum"] / v["itl_n"] if v["itl_n"] else None,
                context=v["context"] / v["output"] if v["output"] and v["context"] else None)
        return out
