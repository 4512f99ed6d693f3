"""A stand-in for the Kubernetes API server, for the calls the planner's connector makes.

No Kubernetes API server installs from the registries this project uses (PyPI and Debian ship etcd
and kubectl, not kube-apiserver; kind, k3d and minikube download theirs or need Docker), so the
connector's tests talk HTTP to this instead, through the real ``kubernetes`` client:

    with KubeApi(deployments) as api:              # serves http://127.0.0.1:<port>
        ...KubernetesConnector(kubernetes_client(api.url), "sluice")...
        api.requests                               # every request: method, path, query, headers, body

It serves a Deployment's scale subresource (GET, PATCH) and PATCH of a Deployment, as the API server
does for these bodies: a strategic-merge or merge patch of ``spec.replicas`` or of the metadata's
annotations. Every body is checked against Kubernetes' own schema, strict (kubernetes-validate's
files: an unknown field or a wrong type fails), and answered 422 when it does not conform, as the API
server answers; ``api.errors`` keeps what failed. Anything else is answered 404.
"""

from __future__ import annotations

import copy
import functools
import importlib.resources
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
from referencing import Registry, Resource

Manifest = dict[str, Any]

#: The Kubernetes release whose schemas the bodies are held to (the newest kubernetes-validate knows).
SCHEMA_VERSION = "1.37"
#: What the API server accepts for PATCH of these objects (server-side apply is not served here).
PATCH_TYPES = ("application/strategic-merge-patch+json", "application/merge-patch+json")
_DEPLOYMENT = re.compile(r"/apis/apps/v1/namespaces/(?P<namespace>[^/]+)/deployments/(?P<name>[^/]+)(?P<scale>/scale)?")


@functools.cache
def _registry() -> tuple[str, Registry]:
    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    definitions = json.loads((root / f"v{SCHEMA_VERSION}.0-local-strict" / "_definitions.json").read_text())
    return definitions["$id"], Resource.from_contents(definitions) @ Registry()


def schema_errors(instance: Any, definition: str) -> list[str]:
    """Where ``instance`` breaks Kubernetes' strict schema for ``definition``
    (``io.k8s.api.autoscaling.v1.Scale``, ``io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta``...)."""
    uri, registry = _registry()
    validator = jsonschema.Draft202012Validator({"$ref": f"{uri}#/$defs/{definition}"}, registry=registry)
    return [f"{'.'.join(map(str, e.absolute_path)) or '.'}: {e.message}" for e in validator.iter_errors(instance)]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class KubeApi:
    """``deployments``: the Deployments it holds, as manifests (a namespace in their metadata)."""

    deployments: list[Manifest]
    #: Seconds each answer waits before it goes (a slow API server).
    delay_s: float = 0.0
    requests: list[Request] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._objects: dict[tuple[str, str], Manifest] = {}
        for manifest in self.deployments:
            stored = copy.deepcopy(manifest)
            stored["spec"].setdefault("replicas", 1)  # the API server's default
            stored["metadata"].update(resourceVersion="1", uid=f"uid-{stored['metadata']['name']}", generation=1)
            self._objects[(stored["metadata"]["namespace"], stored["metadata"]["name"])] = stored
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kube-api", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def deployment(self, namespace: str, name: str) -> Manifest:
        return copy.deepcopy(self._objects[(namespace, name)])

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def answer(self, request: Request) -> tuple[int, Manifest]:
        match = _DEPLOYMENT.fullmatch(request.path)
        key = (match["namespace"], match["name"]) if match else None
        if match is None or key not in self._objects:
            return 404, _status(404, "NotFound", f"{request.path} not found")
        stored = self._objects[key]
        if request.method == "GET" and match["scale"]:
            return 200, _scale(stored)
        if request.method != "PATCH":
            return 405, _status(405, "MethodNotAllowed", request.method)
        if request.headers.get("content-type") not in PATCH_TYPES:
            return 415, _status(415, "UnsupportedMediaType", str(request.headers.get("content-type")))
        errors = self._patch_errors(request.body, scale=bool(match["scale"]))
        if errors:
            self.errors += errors
            return 422, _status(422, "Invalid", "; ".join(errors))
        if match["scale"]:
            stored["spec"]["replicas"] = request.body["spec"]["replicas"]
        else:
            stored["metadata"].setdefault("annotations", {}).update(request.body["metadata"]["annotations"])
        stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
        return 200, _scale(stored) if match["scale"] else copy.deepcopy(stored)

    @staticmethod
    def _patch_errors(body: Any, *, scale: bool) -> list[str]:
        """What the API server would refuse; and what it would take but this stand-in does not apply."""
        if scale:
            errors = schema_errors(body, "io.k8s.api.autoscaling.v1.Scale")
            served = isinstance(body, dict) and body.keys() == {"spec"} and body["spec"].keys() == {"replicas"}
        else:
            errors = schema_errors(body, "io.k8s.api.apps.v1.Deployment")
            errors = [e for e in errors if e != ".: 'spec' is a required property"]  # a patch, not the object
            served = isinstance(body, dict) and body.keys() == {"metadata"} and body["metadata"].keys() == {"annotations"}
        return errors or ([] if served else [f"not served by this stand-in: {body}"])


def _scale(deployment: Manifest) -> Manifest:
    metadata = deployment["metadata"]
    labels = deployment["spec"]["selector"]["matchLabels"]
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: metadata[k] for k in ("name", "namespace", "resourceVersion", "uid")},
            "spec": {"replicas": deployment["spec"]["replicas"]},
            "status": {"replicas": deployment["spec"]["replicas"],
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}}


def _status(code: int, reason: str, message: str) -> Manifest:
    return {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": reason, "message": message,
            "code": code, "metadata": {}}


def _handler(api: KubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(self.command, url.path, parse_qs(url.query),
                              {k.lower(): v for k, v in self.headers.items()}, json.loads(raw) if raw else None)
            api.requests.append(request)
            time.sleep(api.delay_s)
            code, body = api.answer(request)
            if code == 200 and (errors := schema_errors(body, f"io.k8s.api.{_group(body)}.{body['kind']}")):
                api.errors += [f"answer: {e}" for e in errors]
            payload = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_PATCH = do_PUT = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _group(body: Manifest) -> str:
    """``autoscaling/v1`` -> ``autoscaling.v1``; ``apps/v1`` -> ``apps.v1``."""
    return body["apiVersion"].replace("/", ".")
