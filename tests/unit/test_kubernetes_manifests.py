"""deploy/kubernetes/: every document valid for Kubernetes, and the fields that matter.

No cluster: each document is checked against the OpenAPI schemas of every Kubernetes
release kubernetes-validate ships (bundled with it: no network), in strict mode (a
field Kubernetes does not know is an error); then :func:`problems` checks what makes
the DaemonSets kvagent's (privilege, the host's namespaces, each host path and its
propagation, the probes, no teardown on stop, the update strategy, the keys' modes),
with the bounds taken from the agent's code and systemd unit, and the example
ConfigMaps' configs go through the agent's own config parser with the keys the init
container copies out of a Secret laid out as the kubelet lays it out. The negative
tests break one field each and expect :func:`problems` to name it.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from agent import __version__
from agent.config import DEFAULT_CONFIG_PATH, Config, parse_config
from agent.config.types import ListenAddress
from agent.dhchap import generate, read_secret, secret_problem
from agent.errors import KvagentError
from agent.health.server import STALE_INTERVALS
from agent.initiator.filesystem import MKFS_TIMEOUT
from agent.initiator.mounts import QUOTACHECK_TIMEOUT
from agent.progress import DEVICE_IO_BOUND, GRACE

REPO = Path(__file__).resolve().parents[2]


def _load_kube_manifest() -> ModuleType:
    """scripts/kube_manifest.py, the manifests' reader (a module of scripts/, not of the
    agent)."""
    spec = importlib.util.spec_from_file_location("kube_manifest",
                                                  REPO / "scripts" / "kube_manifest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


km = _load_kube_manifest()



def _release(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


#: Every Kubernetes release whose schemas the installed kubernetes-validate ships (1.25 to
#: 1.37 in its 1.37.0: the releases still supported upstream and on the clouds, and older).
VERSIONS = sorted(set(all_versions()), key=_release)
IMAGE = f"localhost/kvagent:{__version__}"
KEYS_DIR = "/etc/kvagent/keys"
SECRET_DIR = "/run/kvagent-secret"
#: The longest bound of one step of a pass (a quota mount's quotacheck, mkfs.xfs, a
#: device read) plus the watchdog's grace: a pass is a sequence of such steps, and the
#: loop that /healthz watches does not tick while one runs.
LONGEST_STEP = max(QUOTACHECK_TIMEOUT, MKFS_TIMEOUT, DEVICE_IO_BOUND) + GRACE
#: The host paths every agent container mounts: (read-only, propagation).
HOST_PATHS = {
    "/sys/kernel/config": (False, None), "/sys": (False, None),
    "/dev": (False, "HostToContainer"), "/lib/modules": (True, None),
    "/run/udev": (True, None), "/etc/nvme": (False, None), "/var/lib/kvagent": (False, None),
    "/run/kvagent": (False, None), "/etc/lvm": (False, None), "/run/lvm": (False, None),
    "/run/lock/lvm": (False, None),
}
#: The GPU nodes' pools' mount root.
POOL_ROOT = "/var/lib/kvcache"
#: Each DaemonSet's ConfigMap and Secret, and the prefix of the Secret's keys it takes.
ROLES = {
    "kvagent-storage": ("storage", "kvagent-storage-config", "kvagent-storage-keys", ""),
    "kvagent-gpu": ("gpu", "kvagent-gpu-config", "kvagent-gpu-keys", "$(NODE_NAME)."),
}


def timeout_stop_seconds() -> int:
    """systemd/kvagent.service's TimeoutStopSec=, in seconds."""
    text = (REPO / "systemd" / "kvagent.service").read_text()
    m = re.search(r"^TimeoutStopSec=(\d+)(s|min)?$", text, re.M)
    assert m, "kvagent.service has no TimeoutStopSec="
    return int(m[1]) * (60 if m[2] == "min" else 1)


@pytest.fixture(scope="module")
def docs() -> list[Any]:
    return km.load()


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the configs' key files are made for the agent's parser to read."""
    return tmp_path_factory.mktemp("keys")


# ----------------------------------------------------------------- schemas
def test_the_manifests_are_the_expected_documents(docs) -> None:
    kinds = sorted((d.kind, d.name) for d in docs)
    assert kinds == sorted([
        ("Namespace", "kvagent"), ("ServiceAccount", "kvagent"),
        ("DaemonSet", "kvagent-storage"), ("DaemonSet", "kvagent-gpu"),
        ("ConfigMap", "kvagent-storage-config"), ("ConfigMap", "kvagent-gpu-config"),
        ("Secret", "kvagent-storage-keys"), ("Secret", "kvagent-gpu-keys")]), kinds
    # kubectl apply -f deploy/kubernetes/ takes the site-independent part; the site's
    # configs and keys (examples/) are never overwritten by applying the folder again.
    assert {d.kind for d in km.applied(docs)} == {"Namespace", "ServiceAccount", "DaemonSet"}
    assert {d.body["metadata"].get("namespace") for d in docs
            if d.kind != "Namespace"} == {"kvagent"}


def test_schemas_of_several_kubernetes_releases_are_checked() -> None:
    assert len(VERSIONS) >= 2, VERSIONS
    assert _release(VERSIONS[-1]) >= (1, 37), f"kubernetes-validate ships up to {VERSIONS[-1]}"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_is_valid_for_kubernetes(docs, version: str) -> None:
    for doc in docs:
        try:
            kubernetes_validate.validate(doc.body, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc}: not valid for Kubernetes {version}: {exc.message} "
                        f"(at {'/'.join(map(str, exc.absolute_path))})")


def test_strict_validation_refuses_a_field_kubernetes_does_not_know(docs) -> None:
    ds = copy.deepcopy(km.find(docs, "DaemonSet", "kvagent-gpu"))
    km.container(ds)["volumeMounts"][0]["mountPropogation"] = "Bidirectional"
    with pytest.raises(kubernetes_validate.ValidationError, match="mountPropogation"):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


# ----------------------------------------------------------- what matters
def problems(docs: list[Any], stand_ins: Path) -> list[str]:
    """Everything in the manifests that breaks a rule of kvagent's (docs/kubernetes.md);
    empty when none."""
    out: list[str] = []
    ns = km.find(docs, "Namespace", "kvagent")
    if ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") \
            != "privileged":
        out.append("namespace: Pod Security Admission must enforce 'privileged'")
    sa = km.find(docs, "ServiceAccount", "kvagent")
    if sa.get("automountServiceAccountToken") is not False:
        out.append("serviceaccount: automountServiceAccountToken must be false")
    sets = km.daemonsets(docs)
    if set(sets) != set(ROLES):
        out.append(f"daemonsets: {sorted(sets)}, not {sorted(ROLES)}")
    for name, ds in sets.items():
        if name in ROLES:
            out += [f"{name}: {p}" for p in daemonset_problems(docs, name, ds, stand_ins)]
    return out


def daemonset_problems(docs: list[Any], name: str, ds: dict[str, Any],
                       stand_ins: Path) -> list[str]:
    out: list[str] = []
    role, configmap, secret, prefix = ROLES[name]
    spec = km.pod_spec(ds)
    if spec.get("nodeSelector", {}).get(km.ROLE_LABEL) != role:
        out.append(f"nodeSelector must pick {km.ROLE_LABEL}={role}")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in ds["spec"]["selector"]["matchLabels"].items()):
        out.append("selector does not match the pod template's labels")
    if ds["spec"].get("updateStrategy") != {
            "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}:
        out.append("updateStrategy must be RollingUpdate, one node at a time "
                   "(maxUnavailable 1, maxSurge 0: two agents on a node refuse each other)")
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) is not True:
            out.append(f"{field} must be true")
    if spec.get("dnsPolicy") != "ClusterFirstWithHostNet":
        out.append("dnsPolicy must be ClusterFirstWithHostNet (hostNetwork)")
    if spec.get("priorityClassName") != "system-node-critical":
        out.append("priorityClassName must be system-node-critical")
    if {"operator": "Exists"} not in (spec.get("tolerations") or []):
        out.append("must tolerate every taint (operator: Exists): the label picks the nodes")
    if spec.get("automountServiceAccountToken") is not False:
        out.append("automountServiceAccountToken must be false")
    if "fsGroup" in (spec.get("securityContext") or {}):
        out.append("no fsGroup: it would give the config and the keys another group")
    if spec.get("restartPolicy", "Always") != "Always":
        out.append("restartPolicy must be Always")
    grace = spec.get("terminationGracePeriodSeconds", 30)
    if grace < timeout_stop_seconds():
        out.append(f"terminationGracePeriodSeconds {grace} < kvagent.service's "
                   f"TimeoutStopSec ({timeout_stop_seconds()} s)")
    everyone = km.containers(ds) + km.containers(ds, init=True)
    for c in everyone:
        if c.get("image") != IMAGE:
            out.append(f"container {c['name']}: image {c.get('image')}, not {IMAGE}")
        if "lifecycle" in c:
            out.append(f"container {c['name']}: a lifecycle hook (a preStop could tear down)")
        for probe in ("livenessProbe", "startupProbe"):
            if probe in c:
                out.append(f"container {c['name']}: a {probe} can kill a pass in progress "
                           f"(the loop does not tick during a pass; one step alone may take "
                           f"{LONGEST_STEP:g} s)")
    if [c["name"] for c in km.containers(ds)] != [km.AGENT_CONTAINER]:
        out.append("the pod must have the agent's container alone")
        return out
    agent = km.container(ds)
    if agent.get("command") != ["kvagent", "run"] or agent.get("args"):
        out.append("the agent's command must be 'kvagent run'")
    if agent.get("securityContext", {}).get("privileged") is not True:
        out.append("the agent's container must be privileged")
    env = km.environment(ds, "node-x")
    if env.get("NODE_NAME") != "node-x":
        out.append("NODE_NAME must come from spec.nodeName")
    if env.get("PYTHONUNBUFFERED") != "1":
        out.append("PYTHONUNBUFFERED must be 1")
    if "NOTIFY_SOCKET" in env:
        out.append("NOTIFY_SOCKET must not be set (no systemd listens)")
    if env.get("KVAGENT_CONFIG", DEFAULT_CONFIG_PATH) != DEFAULT_CONFIG_PATH:
        out.append(f"the config must be at {DEFAULT_CONFIG_PATH}")
    configs = node_configs(docs, configmap, stand_ins)
    out += host_path_problems(ds, configs)
    out += config_mount_problems(ds, configmap)
    out += key_problems(ds, secret, prefix, configs, stand_ins)
    out += readiness_problems(agent, configs)
    return out


def node_configs(docs: list[Any], configmap: str, stand_ins: Path) -> dict[str, Config]:
    """The ConfigMap's configs by node name, parsed by the agent, each key file
    /etc/kvagent/keys/NAME read from ``stand_ins``/NAME (a secret made there when
    missing); :func:`key_files` gives the paths back as the config names them."""
    out = {}
    for key, text in km.configmap_files(docs, configmap).items():
        for name in set(_KEY_PATH.findall(text)):
            path = stand_ins / name
            if not path.exists():
                path.write_text(generate().text + "\n")
                path.chmod(0o600)
        text = _KEY_PATH.sub(lambda m: f"{stand_ins}/{m[1]}", text)
        out[key.removesuffix(".yaml")] = parse_config(text, key)
    return out


_KEY_PATH = re.compile(re.escape(KEYS_DIR) + r"/([A-Za-z0-9_.-]+)")


def host_path_problems(ds: dict[str, Any], configs: dict[str, Config]) -> list[str]:
    out: list[str] = []
    mounts = {m.container_path: m for m in km.host_mounts(ds)}
    for m in mounts.values():
        if m.host_path != m.container_path:
            out.append(f"host path {m.host_path} is mounted at {m.container_path}: the "
                       "agent names host paths, so inside must be outside")
        if m.propagation == "Bidirectional" and m.host_path != POOL_ROOT:
            out.append(f"{m.host_path}: Bidirectional is for the pools' mount root only")
    wanted = dict(HOST_PATHS)
    if km.role(ds) == "gpu":
        wanted[POOL_ROOT] = (False, "Bidirectional")
    for path, (read_only, propagation) in wanted.items():
        m = mounts.get(path)
        if m is None:
            out.append(f"host path {path} is not mounted")
            continue
        if m.read_only != read_only:
            out.append(f"host path {path} must be {'read-only' if read_only else 'writable'}")
        if propagation and m.propagation != propagation:
            out.append(f"host path {path}: mountPropagation {m.propagation}, not {propagation}")
    for node, cfg in configs.items():
        for what, path in (("state_dir", cfg.node.state_dir), ("run_dir", cfg.node.run_dir),
                           ("nvme_dir", cfg.node.nvme_dir), ("configfs", cfg.node.configfs),
                           ("sysfs", cfg.node.sysfs)):
            if path not in mounts:
                out.append(f"{node}: node.{what} {path} is not a host path")
        for pool in cfg.initiator.pools if cfg.initiator else ():
            under = [m for m in mounts.values() if m.propagation == "Bidirectional"
                     and (pool.mount + "/").startswith(m.container_path.rstrip("/") + "/")]
            if not under:
                out.append(f"{node}: pool {pool.name}'s mount {pool.mount} is under no "
                           "Bidirectional host path: the host and the engines would not "
                           "see it")
    return out


def config_mount_problems(ds: dict[str, Any], configmap: str) -> list[str]:
    out: list[str] = []
    found = [m for m in km.mounts(ds) if m["mountPath"] == DEFAULT_CONFIG_PATH]
    if len(found) != 1:
        return [f"no single mount at {DEFAULT_CONFIG_PATH}"]
    m = found[0]
    if m["volume"].get("configMap", {}).get("name") != configmap:
        out.append(f"{DEFAULT_CONFIG_PATH} must come from the ConfigMap {configmap}")
    if km.sub_path(m, {"NODE_NAME": "node-x"}) != "node-x.yaml":
        out.append(f"{DEFAULT_CONFIG_PATH} must be the file <node name>.yaml (a subPath: a "
                   "ConfigMap volume's files are symbolic links, which kvagent refuses)")
    if not m.get("readOnly"):
        out.append(f"{DEFAULT_CONFIG_PATH} must be read-only")
    mode = m["volume"].get("configMap", {}).get("defaultMode", 0o644)
    if mode & 0o022:
        out.append(f"the config's mode {mode:04o} lets others write it (kvagent refuses it)")
    return out


def key_problems(ds: dict[str, Any], secret: str, prefix: str, configs: dict[str, Config],
                 stand_ins: Path) -> list[str]:
    out: list[str] = []
    keys = [m for m in km.mounts(ds) if m["mountPath"] == KEYS_DIR]
    if len(keys) != 1 or keys[0]["volume"].get("emptyDir", {}).get("medium") != "Memory" \
            or not keys[0].get("readOnly"):
        out.append(f"{KEYS_DIR} must be an in-memory emptyDir, read-only for the agent")
    inits = km.containers(ds, init=True)
    if [c["name"] for c in inits] != ["keys"]:
        return [*out, "the init container 'keys' must copy the keys out of the Secret"]
    init = inits[0]
    sc = init.get("securityContext", {})
    if sc.get("privileged") or sc.get("capabilities", {}).get("drop") != ["ALL"] \
            or sc.get("allowPrivilegeEscalation") is not False:
        out.append("the init container 'keys' needs no privilege: drop ALL capabilities")
    source = [m for m in km.mounts(ds, "keys") if m["mountPath"] == SECRET_DIR]
    if len(source) != 1 or source[0]["volume"].get("secret", {}).get("secretName") != secret:
        out.append(f"the init container must read the Secret {secret} at {SECRET_DIR}")
    else:
        mode = source[0]["volume"]["secret"].get("defaultMode", 0o644)
        if mode & 0o077:
            out.append(f"the Secret's files have mode {mode:04o}: group or others can "
                       "read them")
    if km.environment(ds, "node-x", "keys").get("KEY_PREFIX") != km.expand(
            prefix, {"NODE_NAME": "node-x"}):
        out.append(f"the init container must take the Secret's keys named {prefix}*")
    for node, cfg in configs.items():
        for path in key_files(cfg, stand_ins):
            if os.path.dirname(path) != KEYS_DIR:
                out.append(f"{node}: key file {path} is not in {KEYS_DIR}")
    return out


def key_files(cfg: Config, stand_ins: Path | None = None) -> list[str]:
    """Every key file a config names (those in ``stand_ins``, where :func:`node_configs`
    put them, as the ConfigMap names them)."""
    out: list[str] = []
    for pool in cfg.target.pools if cfg.target else ():
        for host in pool.hosts:
            if host.auth:
                out += [p for p in (host.auth.key_file, host.auth.ctrl_key_file) if p]
            if host.tls:
                out.append(host.tls.key_file)
    for pool in cfg.initiator.pools if cfg.initiator else ():
        if pool.auth:
            out += [p for p in (pool.auth.key_file, pool.auth.ctrl_key_file) if p]
        if pool.tls:
            out.append(pool.tls.key_file)
    if stand_ins is None:
        return out
    return [f"{KEYS_DIR}/{p.removeprefix(f'{stand_ins}/')}"
            if p.startswith(f"{stand_ins}/") else p for p in out]


def readiness_problems(agent: dict[str, Any], configs: dict[str, Config]) -> list[str]:
    out: list[str] = []
    probe = agent.get("readinessProbe", {}).get("httpGet")
    if probe is None or probe.get("path") != "/readyz":
        return ["the agent needs a readiness probe on /readyz"]
    if probe.get("host") != "127.0.0.1":
        out.append("the readiness probe must ask 127.0.0.1: health.listen stays on the "
                   "node's loopback, which the kubelet reaches with hostNetwork")
    for node, cfg in configs.items():
        listen: ListenAddress = cfg.health.listen
        if not listen.is_loopback or listen.port != probe.get("port"):
            out.append(f"{node}: health.listen {listen} is not what the readiness probe "
                       f"asks ({probe.get('host')}:{probe.get('port')})")
    return out


def test_the_manifests_keep_kvagent_s_rules(docs, stand_ins: Path) -> None:
    assert problems(docs, stand_ins) == []


def test_the_configs_in_the_examples_are_where_the_daemonsets_look(
        docs, stand_ins: Path) -> None:
    for _, configmap, _, _ in ROLES.values():
        configs = node_configs(docs, configmap, stand_ins)
        assert configs, configmap
        for node, cfg in configs.items():
            assert cfg.node.name == node, f"{configmap}: key {node}.yaml is node {cfg.node.name}"
    storage = node_configs(docs, "kvagent-storage-config", stand_ins)
    gpu = node_configs(docs, "kvagent-gpu-config", stand_ins)
    assert all(c.target and not c.initiator for c in storage.values())
    assert all(c.initiator and not c.target for c in gpu.values())
    # the GPU nodes are the storage pools' hosts
    hosts = {h.name for c in storage.values() for p in c.target.pools for h in p.hosts}
    assert hosts == set(gpu)


def test_liveness_is_left_out_because_a_step_outlasts_the_loop_s_tick(
        docs, stand_ins: Path) -> None:
    """/healthz turns 503 after STALE_INTERVALS loop intervals without a tick, and the loop
    does not tick during a pass: one step alone (mkfs, a quota mount) outlasts that, and a
    pass of many steps has no bound at all. So there is no liveness probe."""
    for configmap in ("kvagent-storage-config", "kvagent-gpu-config"):
        for cfg in node_configs(docs, configmap, stand_ins).values():
            assert STALE_INTERVALS * cfg.health.interval < LONGEST_STEP
    for ds in km.daemonsets(docs).values():
        for c in km.containers(ds) + km.containers(ds, init=True):
            assert "livenessProbe" not in c and "startupProbe" not in c


# ------------------------------------------------ the checker can fail
def _break(docs: list[Any], name: str, change) -> list[Any]:
    """The documents with DaemonSet ``name`` changed by ``change(daemonset)``."""
    out = []
    for d in docs:
        if d.kind == "DaemonSet" and d.name == name:
            body = copy.deepcopy(d.body)
            change(body)
            d = km.Document(d.path, d.index, body)
        out.append(d)
    return out


def _mount(ds: dict[str, Any], path: str) -> dict[str, Any]:
    return next(m for m in km.container(ds)["volumeMounts"] if m["mountPath"] == path)


@pytest.mark.parametrize(("name", "change", "expected"), [
    ("kvagent-gpu", lambda ds: _mount(ds, POOL_ROOT).pop("mountPropagation"),
     "/var/lib/kvcache: mountPropagation None, not Bidirectional"),
    ("kvagent-gpu", lambda ds: _mount(ds, "/dev").pop("mountPropagation"),
     "/dev: mountPropagation None, not HostToContainer"),
    ("kvagent-storage", lambda ds: _mount(ds, "/lib/modules").pop("readOnly"),
     "/lib/modules must be read-only"),
    ("kvagent-storage", lambda ds: _mount(ds, "/run/udev").pop("readOnly"),
     "/run/udev must be read-only"),
    ("kvagent-gpu", lambda ds: _mount(ds, "/var/lib/kvagent").update(
        mountPath="/state"), "node.state_dir /var/lib/kvagent is not a host path"),
    ("kvagent-storage", lambda ds: _mount(ds, "/dev").update(mountPropagation="Bidirectional"),
     "/dev: Bidirectional is for the pools' mount root only"),
    ("kvagent-gpu", lambda ds: km.container(ds)["securityContext"].update(privileged=False),
     "must be privileged"),
    ("kvagent-storage", lambda ds: km.pod_spec(ds).update(hostPID=False), "hostPID must be true"),
    ("kvagent-gpu", lambda ds: km.pod_spec(ds).update(securityContext={"fsGroup": 1000}),
     "no fsGroup"),
    ("kvagent-gpu", lambda ds: km.pod_spec(ds).update(hostIPC=False), "hostIPC must be true"),
    ("kvagent-gpu", lambda ds: km.pod_spec(ds).update(hostNetwork=False),
     "hostNetwork must be true"),
    ("kvagent-gpu", lambda ds: km.pod_spec(ds)["nodeSelector"].update(
        {km.ROLE_LABEL: "storage"}), "must pick kvagent.io/role=gpu"),
    ("kvagent-gpu", lambda ds: km.container(ds).update(livenessProbe={
        "httpGet": {"host": "127.0.0.1", "port": 9808, "path": "/healthz"},
        "periodSeconds": 60, "failureThreshold": 40}), "a livenessProbe can kill a pass"),
    ("kvagent-storage", lambda ds: km.container(ds).update(lifecycle={
        "preStop": {"exec": {"command": ["kvagent", "apply"]}}}), "a lifecycle hook"),
    ("kvagent-storage", lambda ds: km.pod_spec(ds).update(terminationGracePeriodSeconds=30),
     "terminationGracePeriodSeconds 30 < kvagent.service's TimeoutStopSec (45 s)"),
    ("kvagent-gpu", lambda ds: ds["spec"].update(updateStrategy={"type": "OnDelete"}),
     "updateStrategy must be RollingUpdate"),
    ("kvagent-storage", lambda ds: ds["spec"]["updateStrategy"]["rollingUpdate"].update(
        maxSurge=1), "updateStrategy must be RollingUpdate"),
    ("kvagent-gpu", lambda ds: km.volume(ds, "secret-keys")["secret"].update(
        defaultMode=0o644), "the Secret's files have mode 0644"),
    ("kvagent-gpu", lambda ds: km.volume(ds, "config")["configMap"].update(defaultMode=0o666),
     "the config's mode 0666 lets others write it"),
    ("kvagent-storage", lambda ds: _mount(ds, DEFAULT_CONFIG_PATH).update(
        subPathExpr="", subPath=None), "must be the file <node name>.yaml"),
    ("kvagent-gpu", lambda ds: km.container(ds)["readinessProbe"]["httpGet"].pop("host"),
     "the readiness probe must ask 127.0.0.1"),
    ("kvagent-gpu", lambda ds: km.container(ds)["readinessProbe"]["httpGet"].update(
        port=9809), "is not what the readiness probe asks (127.0.0.1:9809)"),
    ("kvagent-gpu", lambda ds: km.container(ds, "keys")["env"][-1].update(value=""),
     "must take the Secret's keys named $(NODE_NAME).*"),
    ("kvagent-storage", lambda ds: km.container(ds).update(image="localhost/kvagent:latest"),
     "image localhost/kvagent:latest"),
    ("kvagent-gpu", lambda ds: km.container(ds)["env"].append(
        {"name": "NOTIFY_SOCKET", "value": "/run/systemd/notify"}), "NOTIFY_SOCKET"),
])
def test_the_checker_names_a_broken_field(docs, stand_ins: Path, name: str, change,
                                          expected: str) -> None:
    found = problems(_break(docs, name, change), stand_ins)
    assert any(expected in p and p.startswith(name) for p in found), found


# ------------------------------------------- the configs, with their keys
def kubelet_secret_volume(root: Path, files: dict[str, str], mode: int) -> None:
    """A Secret volume as the kubelet's atomic writer makes it: the files in a
    timestamped directory, ``..data`` a link to it, each key a link into ``..data``."""
    stamp = root / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for key, text in files.items():
        (stamp / key).write_text(text + "\n")
        (stamp / key).chmod(mode)
    (root / "..data").symlink_to(stamp.name)
    for key in files:
        (root / key).symlink_to(f"..data/{key}")


def run_keys_init(ds: dict[str, Any], node: str, secret: Path, keys: Path) -> str:
    """The DaemonSet's init container 'keys', run here with sh: its script and
    environment as the kubelet would give them on ``node``, its two paths moved to
    ``secret`` (the Secret volume) and ``keys`` (the emptyDir)."""
    init = km.container(ds, "keys")
    assert init["command"] == ["/bin/sh", "-c"] and len(init["args"]) == 1
    script = init["args"][0].replace(SECRET_DIR, str(secret)).replace(KEYS_DIR, str(keys))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **km.environment(ds, node, "keys")}
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True,
                          check=False, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_example_configs_pass_the_agent_s_validation_with_their_keys(
        docs, tmp_path: Path) -> None:
    """Each node's config, as its pod gets it: the Secret's keys (real secrets in place
    of the placeholders) in the kubelet's layout of links, copied by the init container,
    then the config parsed by the agent, which reads and checks every key file."""
    for name, (_, configmap, secret, _) in ROLES.items():
        ds = km.daemonsets(docs)[name]
        for key, text in km.configmap_files(docs, configmap).items():
            node = key.removesuffix(".yaml")
            where = tmp_path / name / node
            volume, keys = where / "secret", where / "keys"
            keys.mkdir(parents=True)
            keys.chmod(0o777)  # an emptyDir
            placeholders = {k: find_secret_text(docs, secret, k)
                            for k in km.secret_keys(docs, secret)}
            kubelet_secret_volume(volume, {k: generate().text for k in placeholders}, 0o400)
            # the kubelet's files are links, which kvagent does not follow
            link = volume / next(iter(placeholders))
            with pytest.raises(KvagentError, match="is a symlink"):
                read_secret(str(link))
            copied = run_keys_init(ds, node, volume, keys)
            assert f"{len(list(keys.iterdir()))} file(s) copied" in copied, copied
            assert stat.S_IMODE(keys.stat().st_mode) == 0o700
            cfg = parse_config(text.replace(KEYS_DIR + "/", f"{keys}/"), key)
            files = key_files(cfg)
            assert files, f"{key} names no key file"
            for path in files:
                st = os.stat(path, follow_symlinks=False)
                assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, path
                read_secret(path)
            if name == "kvagent-gpu":  # a GPU node gets its own keys, no other node's
                assert sorted(p.name for p in keys.iterdir()) == ["dhchap.key"], key


def find_secret_text(docs: list[Any], secret: str, key: str) -> str:
    body = km.find(docs, "Secret", secret)
    return (body.get("stringData") or {}).get(key) or (body.get("data") or {})[key]


def test_the_example_secrets_hold_placeholders_the_agent_refuses(docs) -> None:
    for secret in ("kvagent-storage-keys", "kvagent-gpu-keys"):
        body = km.find(docs, "Secret", secret)
        assert "data" not in body, f"{secret}: examples hold placeholders, in stringData"
        for key, text in body["stringData"].items():
            assert text.startswith("PLACEHOLDER"), f"{secret}: {key} is not a placeholder"
            assert secret_problem(text) is not None, f"{secret}: {key} reads as a secret"


def test_the_gpu_secret_has_a_key_for_each_gpu_node(docs, stand_ins: Path) -> None:
    gpu = node_configs(docs, "kvagent-gpu-config", stand_ins)
    keys = km.secret_keys(docs, "kvagent-gpu-keys")
    storage = km.secret_keys(docs, "kvagent-storage-keys")
    assert keys == sorted(f"{node}.dhchap.key" for node in gpu)
    assert storage == sorted(f"{node}.key" for node in gpu)


def test_the_reader_expands_variables_as_the_kubelet_does() -> None:
    env = {"NODE_NAME": "gpu-01"}
    assert km.expand("$(NODE_NAME).dhchap.key", env) == "gpu-01.dhchap.key"
    assert km.expand("$(UNSET).yaml", env) == "$(UNSET).yaml"  # left as written
    assert km.expand("$$(NODE_NAME)", env) == "$(NODE_NAME)"  # $$ escapes
    assert km.sub_path({"subPathExpr": "$(NODE_NAME).yaml"}, env) == "gpu-01.yaml"
    assert km.sub_path({"subPath": "x"}, env) == "x"
