"""kvagent's Kubernetes manifests (deploy/kubernetes/) read as the kubelet reads them.

For the manifests' unit tests (tests/unit/test_kubernetes_manifests.py) and for tools
that run the DaemonSets' containers outside Kubernetes exactly as the manifests say
(``podman run`` with the same mounts, privileges and environment): the documents, a
DaemonSet's containers, their host-path mounts, their environment on a given node
(``fieldRef`` and ``$(VAR)`` resolved as the kubelet resolves them), the ConfigMaps'
files. Standard library and PyYAML only; not part of the agent (nothing under agent/
imports it). From another script in scripts/: ``import kube_manifest``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
#: The manifests: ``kubectl apply -f`` this folder; examples/ below it holds the
#: site's part (ConfigMaps with the nodes' configs, the Secrets), to edit first.
MANIFESTS = REPO / "deploy" / "kubernetes"
NAMESPACE = "kvagent"
#: The node label that picks each DaemonSet's nodes, and its values.
ROLE_LABEL = "kvagent.io/role"
#: The agent's container in each DaemonSet.
AGENT_CONTAINER = "kvagent"


@dataclass(frozen=True)
class Document:
    """One YAML document of a manifest file."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.body["kind"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}[{self.index}] {self.kind}/{self.name}"


@dataclass(frozen=True)
class HostMount:
    """A host path a container mounts, as the kubelet hands it to the runtime."""

    volume: str
    host_path: str
    #: hostPath's ``type`` ("" when not given: no check)
    host_type: str
    container_path: str
    read_only: bool
    #: ``None``, ``HostToContainer`` or ``Bidirectional`` (Kubernetes' default: None)
    propagation: str


def load(root: Path = MANIFESTS) -> list[Document]:
    """Every document of every ``*.yaml`` below ``root`` (examples/ included), in path
    order; empty documents are left out."""
    docs = []
    for path in sorted(root.rglob("*.yaml")):
        with path.open() as f:
            for i, body in enumerate(yaml.safe_load_all(f)):
                if body is not None:
                    docs.append(Document(path, i, body))
    return docs


def applied(docs: Iterable[Document], root: Path = MANIFESTS) -> list[Document]:
    """The documents ``kubectl apply -f <root>/`` applies (not examples/: it does not
    recurse)."""
    return [d for d in docs if d.path.parent == root]


def find(docs: Iterable[Document], kind: str, name: str) -> dict[str, Any]:
    """The body of the one document of ``kind`` named ``name``."""
    found = [d.body for d in docs if d.kind == kind and d.name == name]
    if len(found) != 1:
        raise LookupError(f"{len(found)} documents are {kind}/{name}")
    return found[0]


def daemonsets(docs: Iterable[Document]) -> dict[str, dict[str, Any]]:
    """The DaemonSets by name."""
    return {d.name: d.body for d in docs if d.kind == "DaemonSet"}


def pod_spec(daemonset: Mapping[str, Any]) -> dict[str, Any]:
    return daemonset["spec"]["template"]["spec"]


def role(daemonset: Mapping[str, Any]) -> str:
    """The value of :data:`ROLE_LABEL` the DaemonSet's nodes carry."""
    return pod_spec(daemonset)["nodeSelector"][ROLE_LABEL]


def containers(daemonset: Mapping[str, Any], *, init: bool = False) -> list[dict[str, Any]]:
    """The pod's containers (``init``: its init containers, in the order they run)."""
    return list(pod_spec(daemonset).get("initContainers" if init else "containers") or [])


def container(daemonset: Mapping[str, Any], name: str = AGENT_CONTAINER) -> dict[str, Any]:
    """A container of the pod by name (init containers included)."""
    for c in containers(daemonset) + containers(daemonset, init=True):
        if c["name"] == name:
            return c
    raise LookupError(f"no container {name!r}")


def volume(daemonset: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A volume of the pod by name."""
    for v in pod_spec(daemonset).get("volumes") or []:
        if v["name"] == name:
            return v
    raise LookupError(f"no volume {name!r}")


def mounts(daemonset: Mapping[str, Any], name: str = AGENT_CONTAINER) -> list[dict[str, Any]]:
    """A container's volume mounts, each with its volume as ``"volume"``."""
    return [{**m, "volume": volume(daemonset, m["name"])}
            for m in container(daemonset, name).get("volumeMounts") or []]


def host_mounts(daemonset: Mapping[str, Any], name: str = AGENT_CONTAINER) -> list[HostMount]:
    """A container's mounts of host paths."""
    out = []
    for m in mounts(daemonset, name):
        host = m["volume"].get("hostPath")
        if host is None:
            continue
        out.append(HostMount(m["name"], host["path"], host.get("type", ""), m["mountPath"],
                             bool(m.get("readOnly", False)),
                             m.get("mountPropagation") or "None"))
    return out


def environment(daemonset: Mapping[str, Any], node_name: str,
                name: str = AGENT_CONTAINER) -> dict[str, str]:
    """A container's environment on the node ``node_name``, as the kubelet makes it:
    ``fieldRef: spec.nodeName`` resolved, ``$(VAR)`` of an earlier variable expanded.
    Any other ``valueFrom`` is refused (this reader knows no other)."""
    env: dict[str, str] = {}
    for var in container(daemonset, name).get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[var["name"]] = node_name
        else:
            raise ValueError(f"{name}: env {var['name']}: a source this reader does not know")
    return env


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (env values, command, args, subPathExpr): a
    defined variable is replaced, an undefined reference stays as written, ``$$`` is
    ``$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REFERENCE.sub(one, text)


def sub_path(mount: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """The file or directory of the volume a mount takes (``subPath``, or ``subPathExpr``
    expanded); None for the whole volume."""
    if "subPathExpr" in mount:
        return expand(mount["subPathExpr"], env)
    return mount.get("subPath")


def configmap_files(docs: Iterable[Document], name: str) -> dict[str, str]:
    """A ConfigMap's files (its ``data``) by key."""
    return dict(find(docs, "ConfigMap", name).get("data") or {})


def secret_keys(docs: Iterable[Document], name: str) -> list[str]:
    """A Secret's keys (``data`` and ``stringData``)."""
    body = find(docs, "Secret", name)
    return sorted({*(body.get("data") or {}), *(body.get("stringData") or {})})
