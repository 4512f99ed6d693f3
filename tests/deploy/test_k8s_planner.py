"""deploy/k8s/overlays/planner: the mocker overlay with the planner in place of KEDA's scalers.

Its rendering (kustomize's) and its Kubernetes kinds' validity are checked with the other overlays'
(tests/deploy/test_k8s.py, EVERY_OVERLAY). Here: everything else is the mocker overlay's exactly, so
that overlay's checks hold for it too; no scaler is left on a worker Deployment; the planner's Role
lets it do what planner/connectors/kubernetes.py calls, on the Deployments it names.
"""

from __future__ import annotations

import pytest

from core.pools import Pool
from planner.connectors.base import PoolRef
from planner.connectors.kubernetes import worker_deployment
from tests.deploy.checks import parse_sluice, sluice_argv
from tests.deploy.test_k8s import (
    CUSTOM_KINDS,
    Manifest,
    custom_resource_errors,
    of_kind,
    pod_spec,
    render,
    settings_of,
)

PLANNER = {"app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": "planner"}
WORKERS = {f"worker-{pool}" for pool in Pool}


def planner_objects() -> dict[tuple[str, str], Manifest]:
    return {(m["kind"], m["metadata"]["name"]): m for m in render("planner") if m["metadata"]["labels"] == PLANNER}


def test_the_mocker_overlay_less_its_scalers_plus_the_planner() -> None:
    ours = [m for m in render("planner") if m["metadata"]["labels"] != PLANNER]
    mocker = [m for m in render("mocker") if m["kind"] != "ScaledObject"]
    assert ours == mocker
    assert set(planner_objects()) == {("Deployment", "planner"), ("ServiceAccount", "sluice-planner"),
                                      ("Role", "sluice-planner"), ("RoleBinding", "sluice-planner")}
    assert {m["metadata"].get("namespace") for m in render("planner")} == {"sluice"}


def test_no_scaler_is_left_on_a_worker_deployment() -> None:
    manifests = render("planner")
    assert of_kind(manifests, "ScaledObject") == {}
    assert not [m for m in manifests if m["kind"] == "HorizontalPodAutoscaler"]
    assert WORKERS <= set(of_kind(manifests, "Deployment"))
    for name in WORKERS:
        assert "replicas" not in of_kind(manifests, "Deployment")[name]["spec"], "re-applying must not reset the size"
    custom = [m for m in manifests if (m["apiVersion"], m["kind"]) in CUSTOM_KINDS]
    assert {m["metadata"]["name"]: custom_resource_errors(m) for m in custom} == {m["metadata"]["name"]: [] for m in custom}


def test_the_role_lets_the_planner_read_and_patch_the_worker_deployments_scale() -> None:
    objects = planner_objects()
    deployment, role, binding = (objects[("Deployment", "planner")], objects[("Role", "sluice-planner")],
                                 objects[("RoleBinding", "sluice-planner")])
    account = pod_spec(deployment)["serviceAccountName"]
    assert ("ServiceAccount", account) in objects
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "sluice"}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sluice-planner"}
    granted = {(group, resource, name, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for name in rule["resourceNames"] for verb in rule["verbs"]}
    # What the connector calls: get and patch the scale subresource, patch the Deployment's annotation.
    defaults = {worker_deployment(PoolRef("smollm2", pool)) for pool in Pool}
    assert defaults == WORKERS
    needed = {("apps", resource, name, verb) for resource in ("deployments", "deployments/scale")
              for name in WORKERS for verb in ("get", "patch")}
    assert granted == needed, "exactly what the connector needs, on the worker Deployments only"


def test_one_planner_at_a_time_in_the_sluice_image() -> None:
    manifests = render("planner")
    deployment = of_kind(manifests, "Deployment")["planner"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}, "a rollout must not run two planners"
    (container,) = pod_spec(deployment)["containers"]
    assert container["image"] == pod_spec(of_kind(manifests, "Deployment")["frontend"])["containers"][0]["image"]
    assert sluice_argv(container["command"]) == ["planner", "--connector", "kubernetes"]
    assert {e["name"]: e.get("value") for e in container["env"]}["SLUICE_PLANNER__CONNECTOR"] == "kubernetes"
    assert [s["configMapRef"]["name"] for s in container["envFrom"]] == ["sluice-config"]


def test_the_planner_command_and_settings_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    manifests = render("planner")
    (container,) = pod_spec(of_kind(manifests, "Deployment")["planner"])["containers"]
    parse_sluice(sluice_argv(container["command"]) or [])
    settings = settings_of(manifests, container, monkeypatch)
    assert settings.planner.connector == "kubernetes"
