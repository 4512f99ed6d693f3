"""planner.connectors.kubernetes through the real ``kubernetes`` client, against a stand-in API server
(tests/support/kube_api.py: no real one installs here) holding the worker Deployments of
deploy/k8s/overlays/planner, which checks every body against Kubernetes' strict schema."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client

from core.pools import Pool
from planner.connectors.base import Connector, PoolRef
from planner.connectors.kubernetes import (
    FIELD_MANAGER,
    REASON_ANNOTATION,
    KubernetesConnector,
    KubernetesScaleError,
    worker_deployment,
)
from tests.deploy.test_k8s import of_kind, render
from tests.support.kube_api import KubeApi, Request, schema_errors
from tests.support.ports import free_port

NAMESPACE = "sluice"
AGG, PREFILL, DECODE = (PoolRef("smollm2", pool) for pool in (Pool.AGG, Pool.PREFILL, Pool.DECODE))
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


def worker_deployments() -> list[dict]:
    return [d for name, d in of_kind(render("planner"), "Deployment").items() if name.startswith("worker-")]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    with KubeApi(worker_deployments()) as server:
        yield server
    assert server.errors == []


def connector_at(url: str, **kwargs) -> KubernetesConnector:
    return KubernetesConnector(client.ApiClient(client.Configuration(host=url)), NAMESPACE, **kwargs)


def calls(api: KubeApi) -> list[tuple[str, str, dict, str | None, object]]:
    return [(r.method, r.path, r.query, r.headers.get("content-type") if r.body is not None else None, r.body)
            for r in api.requests]


def scale_path(name: str) -> str:
    return f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{name}/scale"


async def test_scales_up_and_down_through_the_scale_subresource(api: KubeApi) -> None:
    connector: Connector = connector_at(api.url)
    assert connector.name == "kubernetes"
    assert await connector.current(DECODE) == 1, "no replicas in the manifest: the API server's default"
    await connector.scale(DECODE, 4, "decode ITL 41 ms over its 35 ms target")
    assert await connector.current(DECODE) == 4
    await connector.scale(DECODE, 2, "load down 60 %")
    assert await connector.current(DECODE) == 2
    await connector.aclose()

    stored = api.deployment(NAMESPACE, "worker-decode")
    assert stored["spec"]["replicas"] == 2
    assert stored["metadata"]["annotations"] == {REASON_ANNOTATION: "load down 60 %"}
    manager = {"fieldManager": [FIELD_MANAGER]}
    deployment = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/worker-decode"
    assert calls(api) == [
        ("GET", scale_path("worker-decode"), {}, None, None),
        ("PATCH", scale_path("worker-decode"), manager, STRATEGIC_MERGE, {"spec": {"replicas": 4}}),
        ("PATCH", deployment, manager, STRATEGIC_MERGE,
         {"metadata": {"annotations": {REASON_ANNOTATION: "decode ITL 41 ms over its 35 ms target"}}}),
        ("GET", scale_path("worker-decode"), {}, None, None),
        ("PATCH", scale_path("worker-decode"), manager, STRATEGIC_MERGE, {"spec": {"replicas": 2}}),
        ("PATCH", deployment, manager, STRATEGIC_MERGE, {"metadata": {"annotations": {REASON_ANNOTATION: "load down 60 %"}}}),
        ("GET", scale_path("worker-decode"), {}, None, None),
    ]
    assert {api.deployment(NAMESPACE, f"worker-{p}")["spec"]["replicas"] for p in ("agg", "prefill")} == {1}


async def test_each_pool_scales_its_own_deployment_unless_told_another(api: KubeApi) -> None:
    assert [worker_deployment(p) for p in (AGG, PREFILL, DECODE)] == ["worker-agg", "worker-prefill", "worker-decode"]
    assert worker_deployment(DECODE, "{model}-{pool}") == "smollm2-decode"
    connector = connector_at(api.url, deployments={PREFILL: "worker-decode"})
    await connector.scale(AGG, 3, "agg")
    await connector.scale(PREFILL, 5, "prefill, aimed elsewhere")
    await connector.aclose()
    assert [r.path for r in api.requests if r.path.endswith("/scale")] == [scale_path("worker-agg"),
                                                                          scale_path("worker-decode")]
    assert [api.deployment(NAMESPACE, f"worker-{p}")["spec"]["replicas"] for p in ("agg", "prefill", "decode")] == [3, 1, 5]


async def test_zero_replicas_is_a_size_and_negative_ones_are_refused(api: KubeApi) -> None:
    connector = connector_at(api.url)
    await connector.scale(AGG, 0, "idle")
    assert await connector.current(AGG) == 0
    with pytest.raises(ValueError):
        await connector.scale(AGG, -1, "no")
    await connector.aclose()
    assert len(api.requests) == 3


async def test_what_the_api_server_refuses_is_one_error_naming_the_pool(api: KubeApi) -> None:
    connector = connector_at(api.url, deployments={AGG: "worker-missing"})
    with pytest.raises(KubernetesScaleError, match=r"smollm2/agg: deployment sluice/worker-missing: 404 Not Found"):
        await connector.current(AGG)
    with pytest.raises(KubernetesScaleError, match="worker-missing: 404"):
        await connector.scale(AGG, 2, "x")
    await connector.aclose()


async def test_an_unreachable_api_server_is_the_same_error() -> None:
    connector = connector_at(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(KubernetesScaleError, match="smollm2/agg: deployment sluice/worker-agg"):
        await connector.current(AGG)
    await connector.aclose()


async def test_the_event_loop_runs_while_the_api_server_answers(api: KubeApi) -> None:
    api.delay_s = 0.4
    connector = connector_at(api.url)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    sizes = await asyncio.gather(connector.current(AGG), connector.current(PREFILL), connector.current(DECODE))
    elapsed = time.monotonic() - started
    ticker.cancel()
    await connector.aclose()
    assert sizes == [1, 1, 1]
    assert elapsed < 1.0, "the three reads ran side by side, not one after another (1.2 s)"
    assert ticks >= 10


async def test_connect_uses_the_kubeconfig_outside_a_pod(api: KubeApi, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(written := yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "dev",
        "clusters": [{"name": "local", "cluster": {"server": api.url}}],
        "users": [{"name": "planner", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "dev", "context": {"cluster": "local", "user": "planner", "namespace": NAMESPACE}},
                     {"name": "other", "context": {"cluster": "local", "user": "planner"}}],
    }))
    connector = KubernetesConnector.connect(kubeconfig=str(kubeconfig))
    assert connector.namespace == NAMESPACE
    assert await connector.current(PREFILL) == 1
    await connector.aclose()
    assert api.requests[-1].headers["authorization"] == "Bearer t0ken"
    assert KubernetesConnector.connect(kubeconfig=str(kubeconfig), context="other").namespace == "default"
    assert KubernetesConnector.connect("elsewhere", kubeconfig=str(kubeconfig)).namespace == "elsewhere"
    monkeypatch.setattr(KubernetesConnector, "connect", functools.partial(KubernetesConnector.connect,
                                                                          kubeconfig=str(kubeconfig)))
    settings = SimpleNamespace(k8s_namespace="sluice-b", k8s_deployment="{model}-{pool}")
    from_settings = KubernetesConnector.from_settings(settings)
    assert (from_settings.namespace, from_settings.deployment(DECODE)) == ("sluice-b", "smollm2-decode")
    assert kubeconfig.read_text() == written, "the planner never writes the kubeconfig"


def test_the_stand_in_holds_bodies_to_kubernetes_schema() -> None:
    """The check the stand-in applies bites: a wrong type or an unknown field is refused."""
    scale = "io.k8s.api.autoscaling.v1.Scale"
    assert schema_errors({"spec": {"replicas": 3}}, scale) == []
    assert schema_errors({"spec": {"replicas": "3"}}, scale) == ["spec.replicas: '3' is not of type 'integer', 'null'"]
    assert schema_errors({"spec": {"replica": 3}}, scale)
    assert schema_errors({"metadata": {"annotations": {"a": 1}}}, scale)
    assert KubeApi._patch_errors({"spec": {"replicas": 3}, "status": {"replicas": 3}}, scale=True)
    assert KubeApi._patch_errors({"metadata": {"annotations": {REASON_ANNOTATION: "x"}}}, scale=False) == []
    assert KubeApi._patch_errors({"metadata": {"labelz": {}}}, scale=False)
    assert Request("GET", "/", {}, {}, None).body is None
