"""Sizes worker pools on Kubernetes: each pool is a Deployment whose replica count the planner sets.

    connector = KubernetesConnector.connect()     # in a pod: its service account; else the kubeconfig
    await connector.scale(PoolRef("smollm2", Pool.DECODE), 3, "decode ITL 41 ms over its 35 ms target")

A pool maps to a Deployment named by ``template`` (``{model}`` and ``{pool}`` filled in), unless
``deployments`` names one for it; the default, ``worker-{pool}``, is what deploy/k8s runs each pool's
workers in (one model per namespace there, so the model is not in the name). Replicas
are read and written through the Deployment's scale subresource (``deployments/scale``), as ``kubectl
scale`` and HPAs do, so the planner's Role grants nothing over the pods' template. The scale
subresource carries only the count, so the reason goes onto the Deployment in a second patch, as the
annotation :data:`REASON_ANNOTATION` (``kubectl describe deployment worker-decode`` shows it).

Scaling down drains without the planner's help: Kubernetes chooses the pods that go (not-ready ones
first, then the most recently started), and each runs its preStop (``sluice drain``) and gets the
termination grace of deploy/k8s/base/workers.yaml (90 s) for the worker's 60 s drain.

One writer per Deployment: KEDA's ScaledObjects would undo these writes, so the planner's overlay
(deploy/k8s/overlays/planner) deletes them. The Kubernetes client is synchronous; every call runs in a
thread (``asyncio.to_thread``), so the planner's event loop goes on while the API server answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from planner.connectors.base import PoolRef

#: The annotation on a pool's Deployment that holds the reason of the planner's last change.
REASON_ANNOTATION = "sluice.dev/planner-reason"
#: The field manager the API server records for the planner's writes (the Deployment's managedFields).
FIELD_MANAGER = "sluice-planner"
#: (connect, read) timeouts of one API call: a stalled API server fails the interval, not the planner.
REQUEST_TIMEOUT_S = (5.0, 15.0)
#: Where a pod finds its own namespace (mounted with its service account's token).
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


#: The Deployment deploy/k8s/base/workers.yaml runs each pool's workers in.
WORKER_DEPLOYMENT = "worker-{pool}"


def worker_deployment(pool: PoolRef, template: str = WORKER_DEPLOYMENT) -> str:
    """The name ``template`` gives ``pool``'s Deployment."""
    return template.format(model=pool.model, pool=pool.pool.value)


class KubernetesSettings(Protocol):
    """What :meth:`KubernetesConnector.from_settings` reads (the planner's settings group)."""

    k8s_namespace: str
    k8s_deployment: str


class KubernetesScaleError(RuntimeError):
    """The API server could not be reached, or refused a read or a write of a pool's Deployment."""


class KubernetesConnector:
    """The connector contract (:mod:`planner.connectors.base`) over the Kubernetes API."""

    name = "kubernetes"

    def __init__(self, api: client.ApiClient, namespace: str, *, template: str = WORKER_DEPLOYMENT,
                 deployments: Mapping[PoolRef, str] | None = None) -> None:
        self.namespace = namespace
        self.template = template
        self._api = api
        self._apps = client.AppsV1Api(api)
        self._deployments = dict(deployments or {})

    @classmethod
    def from_settings(cls, settings: KubernetesSettings) -> KubernetesConnector:
        """:meth:`connect` to ``settings.k8s_namespace``, Deployments named by ``settings.k8s_deployment``."""
        return cls.connect(settings.k8s_namespace, template=settings.k8s_deployment)

    @classmethod
    def connect(cls, namespace: str | None = None, *, template: str = WORKER_DEPLOYMENT,
                deployments: Mapping[PoolRef, str] | None = None, kubeconfig: str | None = None,
                context: str | None = None) -> KubernetesConnector:
        """A connector with the credentials where it runs: in a pod (and no ``kubeconfig`` given), the
        pod's service account and namespace; elsewhere the kubeconfig (``kubeconfig``, else what kubectl
        reads: $KUBECONFIG or ~/.kube/config), its ``context`` or current context, and that context's
        namespace. ``namespace`` overrides the one found."""
        configuration = client.Configuration()
        if kubeconfig is None and _load_in_pod(configuration):
            found = POD_NAMESPACE_FILE.read_text().strip()
        else:
            config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                    persist_config=False)
            found = _kubeconfig_namespace(kubeconfig, context)
        return cls(client.ApiClient(configuration), namespace or found, template=template, deployments=deployments)

    def deployment(self, pool: PoolRef) -> str:
        """The name of the Deployment that runs ``pool``'s workers."""
        return self._deployments.get(pool) or worker_deployment(pool, self.template)

    async def current(self, pool: PoolRef) -> int:
        """The Deployment's ``.spec.replicas``: what was asked for, whether or not the pods are up yet."""
        name = self.deployment(pool)
        with self._failures(pool, name):
            scale = await asyncio.to_thread(self._apps.read_namespaced_deployment_scale, name, self.namespace,
                                            _request_timeout=REQUEST_TIMEOUT_S)
        return int(scale.spec.replicas or 0)

    async def scale(self, pool: PoolRef, replicas: int, reason: str) -> None:
        """Sets the Deployment's replicas, then records ``reason`` on it; returns once both are stored."""
        if replicas < 0:
            raise ValueError(f"{pool}: {replicas} replicas")
        name = self.deployment(pool)
        with self._failures(pool, name):
            await asyncio.to_thread(self._apps.patch_namespaced_deployment_scale, name, self.namespace,
                                    {"spec": {"replicas": replicas}}, field_manager=FIELD_MANAGER,
                                    _request_timeout=REQUEST_TIMEOUT_S)
            await asyncio.to_thread(self._apps.patch_namespaced_deployment, name, self.namespace,
                                    {"metadata": {"annotations": {REASON_ANNOTATION: reason}}},
                                    field_manager=FIELD_MANAGER, _request_timeout=REQUEST_TIMEOUT_S)

    async def aclose(self) -> None:
        """Closes the client's connections; the Deployments keep the sizes last set."""
        await asyncio.to_thread(self._api.close)

    @contextlib.contextmanager
    def _failures(self, pool: PoolRef, name: str) -> Iterator[None]:
        where = f"{pool}: deployment {self.namespace}/{name}"
        try:
            yield
        except ApiException as exc:
            raise KubernetesScaleError(f"{where}: {exc.status} {exc.reason}") from exc
        except urllib3.exceptions.HTTPError as exc:
            raise KubernetesScaleError(f"{where}: {exc}") from exc


def _load_in_pod(configuration: client.Configuration) -> bool:
    """Loads the pod's service account into ``configuration``; False outside a pod."""
    try:
        config.load_incluster_config(client_configuration=configuration)
    except ConfigException:
        return False
    return True


def _kubeconfig_namespace(kubeconfig: str | None, context: str | None) -> str:
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = next(c for c in contexts if c["name"] == context) if context else current
    return str(chosen["context"].get("namespace") or "default")
