"""Renders a kustomization the way ``kustomize build`` does, for the few features deploy/k8s uses.

Supported: ``resources`` (files and directories holding a kustomization), ``namespace``, and
``patches`` that are strategic-merge files, aimed by the patch's own kind and name or by a
``target`` (kind, name as a regular expression, equality-based ``labelSelector``); a patch whose
top level says ``$patch: delete`` removes the resources it aims at. Any other field
is refused, so a kustomization that grows a feature this module does not apply fails here instead
of rendering something kustomize would not.

Strategic merge, as kustomize's kyaml does it for built-in kinds: maps merge key by key (``null``
deletes); lists with a merge key (``containers``, ``env``: ``name``; ``volumeMounts``:
``mountPath``; ``ports``: ``containerPort``) merge item by item, the patch's items first in the
patch's order, then the items only the original has; every other list is replaced. The
``namespace`` also goes to a (Cluster)RoleBinding's subjects that name one of the kustomization's
ServiceAccounts without a namespace or with ``default``, as kustomize moves references along. When
``kubectl`` or ``kustomize`` is installed, tests/deploy/test_k8s.py holds this renderer equal to it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

Manifest = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "patches"}
#: The list fields merged item by item, and the key that identifies an item (Kubernetes' patchMergeKey).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "ports": "containerPort"}
#: Kinds without a namespace (the ``namespace`` field leaves them alone).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass"}
#: API groups whose kinds kustomize knows the schema of (merge keys apply); custom resources' lists
#: are replaced whole.
BUILTIN_GROUPS = {"", "apps", "batch", "policy", "autoscaling", "networking.k8s.io", "rbac.authorization.k8s.io"}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature this renderer does not implement."""


def build(directory: Path) -> list[Manifest]:
    """Every manifest of the kustomization in ``directory``, patched, in resource order."""
    kustomization = _read_kustomization(directory)
    unknown = set(kustomization) - SUPPORTED_FIELDS
    if unknown:
        raise UnsupportedKustomization(f"{directory}: {sorted(unknown)} not supported")
    manifests: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        manifests += build(path) if path.is_dir() else _load(path)
    for patch_entry in kustomization.get("patches", []):
        _apply_patch(directory, patch_entry, manifests)
    if namespace := kustomization.get("namespace"):
        _set_namespace(manifests, namespace)
    return manifests


def _set_namespace(manifests: list[Manifest], namespace: str) -> None:
    accounts = {m["metadata"]["name"] for m in manifests if m["kind"] == "ServiceAccount"}
    for manifest in manifests:
        if manifest["kind"] not in CLUSTER_SCOPED:
            manifest["metadata"]["namespace"] = namespace
        if manifest["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            for subject in manifest.get("subjects", []):
                if (subject["kind"] == "ServiceAccount" and subject["name"] in accounts
                        and subject.get("namespace", "default") == "default"):
                    subject["namespace"] = namespace


def _read_kustomization(directory: Path) -> dict[str, Any]:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return yaml.safe_load((directory / name).read_text())
    raise FileNotFoundError(f"no kustomization in {directory}")


def _load(path: Path) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _apply_patch(directory: Path, entry: dict[str, Any], manifests: list[Manifest]) -> None:
    unknown = set(entry) - {"path", "target"}
    if unknown:
        raise UnsupportedKustomization(f"{directory}: patch fields {sorted(unknown)} not supported")
    (patch,) = _load(directory / entry["path"])
    target = entry.get("target") or {"kind": patch["kind"], "name": re.escape(patch["metadata"]["name"])}
    matched = [m for m in manifests if _matches(m, target)]
    if not matched:
        raise UnsupportedKustomization(f"{directory}: patch {entry['path']} matches no resource")
    directive = patch.pop("$patch", None)
    if directive == "delete":
        manifests[:] = [m for m in manifests if all(m is not gone for gone in matched)]
        return
    if directive is not None:
        raise UnsupportedKustomization(f"{directory}: patch {entry['path']}: $patch: {directive} not supported")
    for manifest in matched:
        builtin = manifest["apiVersion"].rpartition("/")[0] in BUILTIN_GROUPS
        body = {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")}
        if "labels" in patch.get("metadata", {}) or "annotations" in patch.get("metadata", {}):
            raise UnsupportedKustomization(f"{directory}: patching metadata is not supported")
        merged = merge(manifest, body, builtin=builtin)
        manifest.clear()
        manifest.update(merged)


def _matches(manifest: Manifest, target: dict[str, Any]) -> bool:
    unknown = set(target) - {"kind", "name", "labelSelector"}
    if unknown:
        raise UnsupportedKustomization(f"patch target fields {sorted(unknown)} not supported")
    if "kind" in target and manifest["kind"] != target["kind"]:
        return False
    if "name" in target and not re.fullmatch(target["name"], manifest["metadata"]["name"]):
        return False
    labels = manifest["metadata"].get("labels", {})
    for requirement in filter(None, target.get("labelSelector", "").split(",")):
        key, sep, value = requirement.partition("=")
        if not sep or value.startswith("=") or key.endswith("!"):
            raise UnsupportedKustomization(f"label selector {requirement!r}: only key=value is supported")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def merge(original: Any, patch: Any, *, builtin: bool, field: str | None = None) -> Any:
    """``patch`` merged into ``original`` (neither is changed)."""
    if isinstance(original, dict) and isinstance(patch, dict):
        out = copy.deepcopy(original)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                out[key] = merge(out[key], value, builtin=builtin, field=key)
            else:
                out[key] = copy.deepcopy(value)
        return out
    key = MERGE_KEYS.get(field or "") if builtin else None
    if key and isinstance(original, list) and isinstance(patch, list):
        originals = {item[key]: item for item in original}
        patched = [merge(originals[item[key]], item, builtin=builtin) if item[key] in originals
                   else copy.deepcopy(item) for item in patch]
        keys = {item[key] for item in patch}
        return patched + [copy.deepcopy(item) for item in original if item[key] not in keys]
    return copy.deepcopy(patch)
