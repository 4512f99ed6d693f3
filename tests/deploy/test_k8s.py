"""deploy/k8s: each overlay renders, every manifest is valid for Kubernetes, and the manifests say
what the code does.

Rendering: tests/deploy/kustomize_lite.py, held equal to ``kubectl kustomize`` (or ``kustomize
build``) wherever one is installed. Kubernetes' own kinds: kubernetes-validate's strict schemas
(an unknown field fails) for each version in KUBERNETES_VERSIONS. Custom resources: KEDA's
ScaledObject and prometheus-operator's ServiceMonitor against models generated from their
published CRDs (cloudcoil-models-keda 2.16.1, cloudcoil-models-prometheus-operator 0.80.1, pinned
in requirements/lock.txt); a field they do not know fails too.
"""

from __future__ import annotations

import copy
import functools
import importlib
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from sqlalchemy.engine import make_url

from core.keys import Keys
from core.pools import Pool
from core.settings import Settings
from tests.deploy import kustomize_lite
from tests.deploy.checks import (
    ROOT,
    is_setting,
    parse_sluice,
    quantity_bytes,
    redis_bytes,
    redis_options,
    settings_from,
    sluice_argv,
)

Manifest = dict[str, Any]

K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("mocker", "vllm-gpu")
#: With the planner's, which replaces the KEDA scalers (tests/deploy/test_k8s_planner.py checks the rest).
EVERY_OVERLAY = (*OVERLAYS, "planner")
#: The oldest Kubernetes release the manifests are meant for, and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.30", "1.37")
POOLS: tuple[str, ...] = tuple(Pool)
#: Custom resources: (apiVersion, kind) -> the model generated from the published CRD.
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): ("cloudcoil.models.keda.v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("cloudcoil.models.prometheus_operator.v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"): ("cloudcoil.models.prometheus_operator.v1", "PodMonitor"),
}
#: uvicorn's own backstop past the frontend's drain (sluice/cli.py, _serve).
UVICORN_BACKSTOP_S = 5
#: Time a worker needs past its drain deadline: the requests' hand-over and the engine's shutdown.
WORKER_SHUTDOWN_S = 10


@functools.cache
def _render(overlay: str) -> tuple[Manifest, ...]:
    return tuple(kustomize_lite.build(K8S / "overlays" / overlay))


def render(overlay: str) -> list[Manifest]:
    return copy.deepcopy(list(_render(overlay)))


def of_kind(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def pod_spec(workload: Manifest) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def workloads(manifests: list[Manifest]) -> list[Manifest]:
    return [m for m in manifests if m["kind"] in ("Deployment", "StatefulSet", "Job")]


def sluice_containers(manifests: list[Manifest]) -> list[tuple[Manifest, dict[str, Any]]]:
    return [(w, c) for w in workloads(manifests) for c in pod_spec(w)["containers"]
            if c["image"].split(":")[0] in ("sluice", "sluice-vllm")]


def settings_of(manifests: list[Manifest], container: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the container's process builds: its ConfigMaps, then its literal variables."""
    configmaps = of_kind(manifests, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return settings_from({k: v for k, v in env.items() if k.startswith("SLUICE_")}, monkeypatch)


@pytest.fixture(params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return request.param


def _kustomize_command() -> list[str] | None:
    if kustomize := shutil.which("kustomize"):
        return [kustomize, "build"]
    if kubectl := shutil.which("kubectl"):
        return [kubectl, "kustomize"]
    return None


@pytest.mark.parametrize("overlay", EVERY_OVERLAY)
def test_renders_as_kustomize_does(overlay: str) -> None:
    command = _kustomize_command()
    if command is None:
        pytest.skip("neither kustomize nor kubectl is installed: the renderer is compared where one is")
    out = subprocess.run([*command, str(K8S / "overlays" / overlay)], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    expected = {(m["kind"], m["metadata"]["name"]): m for m in yaml.safe_load_all(out)}
    rendered = {(m["kind"], m["metadata"]["name"]): m for m in render(overlay)}
    assert rendered.keys() == expected.keys()
    assert [key for key in rendered if rendered[key] != expected[key]] == []


@pytest.mark.parametrize("overlay", EVERY_OVERLAY)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_kubernetes_kinds_are_valid(overlay: str, version: str) -> None:
    errors = []
    for manifest in render(overlay):
        if (manifest["apiVersion"], manifest["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{manifest['kind']}/{manifest['metadata']['name']}: {exc.message} at {list(exc.path)}")
    assert errors == []


def custom_resource_errors(manifest: Manifest) -> list[str]:
    """What the CRD's model refuses, or does not know (dropped or changed on the way through it)."""
    module, name = CUSTOM_KINDS[(manifest["apiVersion"], manifest["kind"])]
    model = getattr(importlib.import_module(module), name)
    try:
        parsed = model.model_validate(manifest)
    except ValueError as exc:
        return [str(exc)]
    dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [] if dumped == manifest else [f"not in the CRD's schema: {_difference(manifest, dumped)}"]


def _difference(given: Any, kept: Any, path: str = "") -> list[str]:
    if isinstance(given, dict) and isinstance(kept, dict):
        return [p for key in given for p in _difference(given[key], kept.get(key), f"{path}.{key}")]
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [p for i, (a, b) in enumerate(zip(given, kept, strict=True)) for p in _difference(a, b, f"{path}[{i}]")]
    return [] if given == kept else [path]


def test_custom_resources_match_their_crds(overlay: str) -> None:
    custom = [m for m in render(overlay) if (m["apiVersion"], m["kind"]) in CUSTOM_KINDS]
    assert {m["kind"] for m in custom} == {"ScaledObject", "ServiceMonitor", "PodMonitor"}
    assert {m["metadata"]["name"]: custom_resource_errors(m) for m in custom} == {m["metadata"]["name"]: [] for m in custom}


def test_the_crd_check_refuses_unknown_fields() -> None:
    manifests = render("mocker")
    scaled = of_kind(manifests, "ScaledObject")["worker-agg"]
    scaled["spec"]["minReplicas"] = scaled["spec"].pop("minReplicaCount")
    assert custom_resource_errors(scaled) == ["not in the CRD's schema: ['.spec.minReplicas']"]
    monitor = of_kind(manifests, "ServiceMonitor")["sluice-frontend"]
    monitor["spec"]["endpoints"][0]["interval"] = 15
    assert custom_resource_errors(monitor)


def test_one_worker_deployment_and_scaler_per_pool(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(overlay)
    deployments, scalers = of_kind(manifests, "Deployment"), of_kind(manifests, "ScaledObject")
    (redis,) = [s for s in of_kind(manifests, "Service").values() if s["metadata"]["name"] == "redis"]
    redis_port = redis["spec"]["ports"][0]["port"]
    for pool in POOLS:
        deployment = deployments[f"worker-{pool}"]
        (container,) = pod_spec(deployment)["containers"]
        settings = settings_of(manifests, container, monkeypatch)
        assert settings.worker.pool == pool
        assert "replicas" not in deployment["spec"], "KEDA owns the worker pools' sizes"
        (scaler,) = [s for s in scalers.values() if s["spec"]["scaleTargetRef"]["name"] == f"worker-{pool}"]
        assert scaler["spec"]["minReplicaCount"] >= 1, "a pool at zero gets no queue to wake it"
        (trigger,) = scaler["spec"]["triggers"]
        assert trigger["type"] == "redis"
        meta = trigger["metadata"]
        keys = Keys(settings.redis.namespace)
        assert meta["listName"] == keys.broker_queue_list(keys.pool_queue(settings.model, pool))
        namespace = redis["metadata"]["namespace"]
        assert meta["address"] == f"redis.{namespace}.svc.cluster.local:{redis_port}"
        url = make_url(settings.redis.url)
        assert (url.host, url.port, url.database or "0") == ("redis", redis_port, meta["databaseIndex"])


def test_workers_drain_before_they_are_killed(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(overlay)
    for pool in POOLS:
        deployment = of_kind(manifests, "Deployment")[f"worker-{pool}"]
        (container,) = pod_spec(deployment)["containers"]
        settings = settings_of(manifests, container, monkeypatch)
        grace = pod_spec(deployment)["terminationGracePeriodSeconds"]
        assert grace >= settings.worker.drain_timeout_s + WORKER_SHUTDOWN_S, pool
        worker_id = {e["name"]: e for e in container["env"]}["SLUICE_WORKER__WORKER_ID"]
        assert worker_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert sluice_argv(container["lifecycle"]["preStop"]["exec"]["command"]) == ["drain", "SLUICE_WORKER__WORKER_ID"]


def test_frontend_ready_alive_drained_and_scraped(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(overlay)
    frontend = of_kind(manifests, "Deployment")["frontend"]
    (container,) = pod_spec(frontend)["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    argv = sluice_argv(container["command"])
    assert argv and argv[0] == "serve" and ports["http"] == int(argv[argv.index("--port") + 1])
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    pause = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    settings = settings_of(manifests, container, monkeypatch)
    assert pod_spec(frontend)["terminationGracePeriodSeconds"] >= \
        pause + settings.frontend.drain_timeout_s + UVICORN_BACKSTOP_S
    service = of_kind(manifests, "Service")["frontend"]
    assert service["spec"]["selector"] == frontend["spec"]["template"]["metadata"]["labels"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    (monitor,) = of_kind(manifests, "ServiceMonitor").values()  # the frontend's; the workers' is a PodMonitor
    labels = service["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [(e["port"], e["path"]) for e in monitor["spec"]["endpoints"]] == [("http", "/metrics")]
    assert {p["name"] for p in service["spec"]["ports"]} == {"http"}


def test_sluice_commands_parse_and_variables_are_settings(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(overlay)
    commands = {}
    for workload, container in sluice_containers(manifests):
        argv = sluice_argv(container["command"])
        assert argv is not None, workload["metadata"]["name"]
        parse_sluice(argv)
        commands[workload["metadata"]["name"]] = argv
        if pre_stop := sluice_argv(container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])):
            parse_sluice(pre_stop)
        names = [e["name"] for e in container.get("env", [])]
        for source in container.get("envFrom", []):
            names += of_kind(manifests, "ConfigMap")[source["configMapRef"]["name"]]["data"]
        assert [n for n in names if n.startswith("SLUICE_") and not is_setting(n)] == []
        settings_of(manifests, container, monkeypatch)  # every value is one the settings accept
    assert commands["sluice-db-upgrade"] == ["db", "upgrade"]
    assert commands["bookkeeper"] == ["bookkeeper"]
    assert commands["flower"][0] == "flower"
    assert {commands[f"worker-{pool}"][0] for pool in POOLS} == {"worker"}


def test_references_resolve(overlay: str) -> None:
    manifests = render(overlay)
    configmaps, secrets = of_kind(manifests, "ConfigMap"), of_kind(manifests, "Secret")
    for workload in workloads(manifests):
        for container in pod_spec(workload)["containers"]:
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps
            for env in container.get("env", []):
                if ref := env.get("valueFrom", {}).get("secretKeyRef"):
                    assert ref["key"] in secrets[ref["name"]]["stringData"], (workload["metadata"]["name"], ref)
    for service in of_kind(manifests, "Service").values():
        selected = [w for w in workloads(manifests)
                    if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(selected) == 1, service["metadata"]["name"]
        names = {p.get("name") for c in pod_spec(selected[0])["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names


def test_the_database_and_flower(overlay: str) -> None:
    manifests = render(overlay)
    secret = of_kind(manifests, "Secret")["sluice-secrets"]["stringData"]
    database = make_url(secret["SLUICE_DATABASE_URL"])
    assert (database.host, database.port, database.password) == ("postgres", 5432, secret["POSTGRES_PASSWORD"])
    assert "postgres" in of_kind(manifests, "StatefulSet") and "postgres" in of_kind(manifests, "Service")
    flower = of_kind(manifests, "Deployment")["flower"]
    (container,) = pod_spec(flower)["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]["name"] == "sluice-secrets"
    assert "PUBLISHED_ON" not in env, "unset, docker/flower.sh requires the password"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthcheck"


def test_gpu_overlay_gives_each_worker_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render("vllm-gpu")
    for pool in POOLS:
        deployment = of_kind(manifests, "Deployment")[f"worker-{pool}"]
        (container,) = pod_spec(deployment)["containers"]
        assert container["image"].startswith("sluice-vllm:")
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert settings_of(manifests, container, monkeypatch).worker.engine == "vllm"
        nixl_host = {e["name"]: e for e in container.get("env", [])}.get("SLUICE_WORKER__VLLM__NIXL_HOST")
        if pool == "agg":
            assert nixl_host is None
        else:
            assert nixl_host == {"name": "SLUICE_WORKER__VLLM__NIXL_HOST",
                                 "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    others = [c for w in workloads(manifests) for c in pod_spec(w)["containers"]
              if w["metadata"]["name"] not in {f"worker-{p}" for p in POOLS}]
    assert not [c for c in others if "nvidia.com/gpu" in str(c.get("resources"))]


def test_mocker_overlay_needs_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render("mocker")
    assert "nvidia.com/gpu" not in yaml.safe_dump(manifests)
    for _, container in sluice_containers(manifests):
        assert container["image"].startswith("sluice:")
        assert settings_of(manifests, container, monkeypatch).worker.engine == "mocker"


def test_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\ncommonLabels: {a: b}\n")
    with pytest.raises(kustomize_lite.UnsupportedKustomization):
        kustomize_lite.build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{K8S / 'base'}]\npatches: [{{path: replace.yaml}}]\n")
    (tmp_path / "replace.yaml").write_text("$patch: replace\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: sluice-config}\n")
    with pytest.raises(kustomize_lite.UnsupportedKustomization, match="replace"):
        kustomize_lite.build(tmp_path)


def test_every_worker_serves_its_metrics_where_the_pod_monitor_scrapes(overlay: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers listen on a fixed port of the pod's address and register the pod's IP; the PodMonitor
    selects every worker pod and scrapes that port by name."""
    manifests = render(overlay)
    (monitor,) = of_kind(manifests, "PodMonitor").values()
    [(port_name, path)] = [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]]
    assert path == "/metrics"
    for pool in POOLS:
        worker = of_kind(manifests, "Deployment")[f"worker-{pool}"]
        labels = worker["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        (container,) = [c for c in pod_spec(worker)["containers"] if c["name"] == "worker"]
        settings = settings_of(manifests, container, monkeypatch)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[port_name] == settings.worker.metrics_port and settings.worker.metrics_host == "0.0.0.0"
        (advertised,) = [e for e in container["env"] if e["name"] == "SLUICE_WORKER__METRICS_ADVERTISE_HOST"]
        assert advertised["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_the_shared_kv_tier_is_a_bounded_cache_of_its_own(overlay: str, monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render(overlay)
    (kv_redis,) = pod_spec(of_kind(manifests, "Deployment")["kv-redis"])["containers"]
    options = redis_options(kv_redis["args"])
    maxmemory = redis_bytes(options["maxmemory"])
    assert maxmemory > 0 and options["maxmemory-policy"] == "allkeys-lru"
    assert (options["save"], options["appendonly"]) == ("", "no")
    assert quantity_bytes(kv_redis["resources"]["limits"]["memory"]) > maxmemory, "room for Redis' own overhead"
    service = of_kind(manifests, "Service")["kv-redis"]
    for pool in POOLS:
        (container,) = pod_spec(of_kind(manifests, "Deployment")[f"worker-{pool}"])["containers"]
        settings = settings_of(manifests, container, monkeypatch)
        assert settings.kvbm.redis_url is not None
        url = make_url(settings.kvbm.redis_url)
        assert (url.host, url.port) == ("kv-redis", service["spec"]["ports"][0]["port"])
        assert make_url(settings.redis.url).host != url.host, "apart from the request plane"


def test_workers_keep_host_and_disk_tiers_on_a_volume_of_their_pod(overlay: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An emptyDir on the node's disk: each pod's own, kept across the worker container's restarts,
    bounded a little above the tier's budget (frames' headers, writes in flight); the host tier fits in
    the container's memory limit."""
    manifests = render(overlay)
    for pool in POOLS:
        worker = of_kind(manifests, "Deployment")[f"worker-{pool}"]
        spec = pod_spec(worker)
        (container,) = spec["containers"]
        kvbm = settings_of(manifests, container, monkeypatch).kvbm
        assert kvbm.host_bytes > 0 and kvbm.disk_on
        assert quantity_bytes(container["resources"]["limits"]["memory"]) >= 2 * kvbm.host_bytes
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(kvbm.disk_dir)]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert set(volume) == {"name", "emptyDir"} and "medium" not in volume["emptyDir"]
        assert quantity_bytes(volume["emptyDir"]["sizeLimit"]) > kvbm.disk_bytes
    # Deployments, so KEDA's scalers go on targeting them by name (a ScaledObject's default kind).
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in of_kind(manifests, "ScaledObject").values()}
    assert targets == {f"worker-{pool}" for pool in POOLS} <= set(of_kind(manifests, "Deployment"))
    assert not [s for s in of_kind(manifests, "ScaledObject").values() if "kind" in s["spec"]["scaleTargetRef"]]
