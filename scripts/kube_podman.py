"""A pod of kvagent's manifests as the podman commands the kubelet's work amounts to.

For running the DaemonSets of deploy/kubernetes/ on a machine without Kubernetes,
exactly as the kubelet would run them there: :func:`daemonset_plan` reads a DaemonSet
(through :mod:`kube_manifest`) and gives, for one node, what to prepare on the host (the
volumes, as the kubelet lays them out), the ``podman run`` of each init container and
container, and what deleting the pod amounts to. :func:`engine_pod` makes the pod of an
inference engine that uses the GPU DaemonSet's pools as docs/kubernetes.md says (the
pools' mount root HostToContainer, the rendered configs read-only), for the same
mapping. ``scripts/kube-podman`` is the command line.

The mapping, field by field (anything else in a pod spec, a container, a volume or a
mount is refused with an :class:`Unmappable` error naming the field, never dropped):

- ``hostNetwork: true`` -> ``--network=host --uts=host`` (the CRI gives a host-network
  pod the host's UTS namespace too); otherwise ``--network=none --hostname=<pod>`` (a
  pod network exists only in a cluster: noted). ``hostPID`` -> ``--pid=host``,
  ``hostIPC`` -> ``--ipc=host``. Every container of the pod gets them (a pod's
  containers share its pod_flags).
- ``terminationGracePeriodSeconds`` (default 30) -> ``--stop-timeout``, and the grace of
  the ``podman stop`` that deleting the pod amounts to.
- ``restartPolicy`` (default Always) -> ``--restart`` of the containers; init containers
  run to completion first, one at a time, in order (``--rm``; the kubelet retries a
  failed one, a caller stops at the first failure).
- ``image`` -> the image; ``imagePullPolicy`` -> ``--pull`` (IfNotPresent: missing).
- ``command`` -> ``--entrypoint`` (JSON), ``args`` -> the arguments after the image, each
  with ``$(VAR)`` expanded from the container's environment as the kubelet does.
- ``env`` -> ``--env``, ``fieldRef: spec.nodeName`` resolved to the node's name
  (:func:`kube_manifest.environment`).
- ``securityContext``: ``privileged`` -> ``--privileged``; ``runAsUser``/``runAsGroup`` ->
  ``--user``; ``allowPrivilegeEscalation: false`` -> ``--security-opt=no-new-privileges``;
  ``readOnlyRootFilesystem`` -> ``--read-only --read-only-tmpfs=false`` (podman would
  add tmpfs mounts the kubelet does not); ``capabilities`` -> ``--cap-drop``/``--cap-add``.
  An unprivileged container gets ``--security-opt=seccomp=unconfined``: the kubelet's
  default (no ``seccompProfile``, no ``--seccomp-default``) where podman's is a filter.
- ``resources``: ``requests.cpu`` -> ``--cpu-shares`` (the kubelet's milli-CPU to shares:
  2 without a request), ``limits.cpu`` -> ``--cpus``, ``limits.memory`` -> ``--memory``;
  a memory request only schedules (noted).
- ``readinessProbe``: readiness restarts nothing; noted with what to ask instead.
- Volumes, each mounted at the same path the manifest says, ``readOnly`` -> ``ro``,
  ``mountPropagation`` None / HostToContainer / Bidirectional -> ``rprivate`` /
  ``rslave`` / ``rshared`` (the CRI's PRIVATE, HOST_TO_CONTAINER, BIDIRECTIONAL), always
  ``rbind``:

  - ``hostPath`` -> ``-v PATH:MOUNTPATH:...``; its ``type`` checked or made before the
    start as the kubelet does (Directory: must be one; DirectoryOrCreate: ``mkdir -p``);
  - ``configMap`` / ``secret`` -> a directory under the work directory laid out as the
    kubelet's atomic writer lays it out (``KEY -> ..data/KEY``, ``..data -> ..<dir>``,
    the files of mode ``defaultMode``), filled from a directory of the caller's with one
    file per key; a secret's on a tmpfs. ``subPath``/``subPathExpr`` binds the key's
    file itself (the kubelet resolves the links), as a config must reach kvagent;
  - ``emptyDir`` -> a directory under the work directory, mode 0777, on a tmpfs of
    ``sizeLimit`` for ``medium: Memory``. Not podman's ``--tmpfs``: an emptyDir is shared
    by the pod's containers (the keys init container fills the one the agent reads).

- ``priorityClassName: system-node-critical`` -> ``--oom-score-adj=-997``, the OOM
  score the kubelet gives a node-critical pod's containers (another pod's depends on
  the node's memory: noted).
- What only the scheduler or the API server uses (``nodeSelector``, ``tolerations``,
  ``serviceAccountName`` with ``automountServiceAccountToken: false``, labels'
  selection) has no run-time effect; ``dnsPolicy``, the kubelet's
  ``KUBERNETES_SERVICE_*`` variables and its ``/dev/termination-log`` need a cluster:
  noted.

Standard library and :mod:`kube_manifest` only; nothing here runs a command (the
caller runs the plan: ``scripts/kube-podman ... --format sh | sh``).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath
from typing import Any

import kube_manifest as km

#: Where the plans keep their pods' volumes by default (the kubelet's
#: /var/lib/kubelet/pods/<uid>/volumes): <work dir>/<pod>/volumes/<volume>.
WORK_DIR = "/var/lib/kube-podman"
#: The kvagent pod's ``node.state_dir`` default (agent/config/model.py) and the
#: directory below it where kvagent renders the engines' configs (agent/records.py
#: ENGINES_DIR): what an engine pod mounts read-only.
STATE_DIR = "/var/lib/kvagent"
ENGINES_SUBDIR = "engines"
#: The name of the directory the materialised ConfigMap and Secret files are in (the
#: kubelet's is a timestamp, ``..2006_01_02_15_04_05.NNN``; ``..data`` links to it).
DATA_DIR = "..kube-podman"
#: CRI mount propagation of each of Kubernetes' ``mountPropagation`` values, as podman
#: spells it.
PROPAGATION = {"None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
PULL = {"Always": "always", "IfNotPresent": "missing", "Never": "never"}
RESTART = {"Always": "always", "OnFailure": "on-failure", "Never": "no"}
#: Kubernetes' default grace (PodSpec.terminationGracePeriodSeconds).
DEFAULT_GRACE = 30


class Unmappable(ValueError):
    """A field of the manifest this mapping cannot carry out; names the field."""


@dataclass(frozen=True)
class Run:
    """One container's ``podman run``."""

    #: the container's name in the manifest
    container: str
    #: podman's ``--name``
    name: str
    init: bool
    argv: list[str]


@dataclass(frozen=True)
class Plan:
    """A pod on one node as podman commands: ``prepare`` then ``runs`` in order (each
    init container run to completion before the next), ``remove`` to delete it."""

    pod: str
    node: str
    prepare: list[list[str]]
    runs: list[Run]
    remove: list[list[str]]
    #: what the manifest says that has no podman equivalent here, and what stands in
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def script(self, *, remove: bool = False) -> str:
        """A POSIX shell script of the plan (or of its removal)."""
        lines = ["#!/bin/sh",
                 f"# scripts/kube-podman: pod {self.pod} on node {self.node}"
                 f"{' (removal)' if remove else ''}",
                 *(f"# note: {n}" for n in ([] if remove else self.notes)),
                 "set -eu" if not remove else "set -u"]
        if remove:
            lines += [shlex.join(c) + " || true" for c in self.remove]
        else:
            lines += [shlex.join(c) for c in self.prepare]
            lines += [shlex.join(r.argv) for r in self.runs]
        return "\n".join(lines) + "\n"


# ------------------------------------------------------------------- field checks

#: Pod spec fields with no run-time effect on a named node, and why.
POD_NOT_AT_RUN_TIME = {
    "nodeSelector": "scheduling (the caller names the node)",
    "tolerations": "scheduling",
    "affinity": "scheduling",
    "priority": "scheduling and eviction order",
    "schedulerName": "scheduling",
    "serviceAccountName": "the pod's identity for the API server (no token mounted)",
    "serviceAccount": "the pod's identity for the API server (no token mounted)",
    "enableServiceLinks": "Services' variables, which need a cluster",
}
POD_MAPPED = {"hostNetwork", "hostPID", "hostIPC", "terminationGracePeriodSeconds",
              "restartPolicy", "initContainers", "containers", "volumes",
              "automountServiceAccountToken", "dnsPolicy", "priorityClassName"}
#: The kubelet's OOM score of a node-critical pod's containers (its
#: guaranteedOOMScoreAdj, for priorityClassName system-node-critical).
NODE_CRITICAL_OOM_SCORE_ADJ = -997
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env",
                    "securityContext", "resources", "readinessProbe", "volumeMounts",
                    "workingDir"}
SECURITY_FIELDS = {"privileged", "runAsUser", "runAsGroup", "allowPrivilegeEscalation",
                   "readOnlyRootFilesystem", "capabilities"}
MOUNT_FIELDS = {"name", "mountPath", "readOnly", "mountPropagation", "subPath",
                "subPathExpr"}
VOLUME_FIELDS = {
    "hostPath": {"path", "type"},
    "configMap": {"name", "defaultMode", "optional"},
    "secret": {"secretName", "defaultMode", "optional"},
    "emptyDir": {"medium", "sizeLimit"},
}
#: hostPath types: the check (or the making) before the start, as the kubelet does it.
HOST_PATH_TYPES = {"": None, "Directory": "-d", "DirectoryOrCreate": None, "File": "-f",
                   "Socket": "-S", "CharDevice": "-c", "BlockDevice": "-b",
                   "FileOrCreate": None}


def _unknown(found: Iterable[str], known: Iterable[str], where: str) -> None:
    extra = sorted(set(found) - set(known))
    if extra:
        raise Unmappable(f"{where}.{extra[0]}: not mapped to podman "
                         f"(kube_podman knows {', '.join(sorted(known))})")


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
           "Ei": 2**60}


def quantity(value: Any, where: str) -> float:
    """A Kubernetes resource quantity ("100m", "128Mi", 2) as a number."""
    m = _QUANTITY.match(str(value))
    if m is None or m.group(2) not in _SUFFIX:
        raise Unmappable(f"{where}: {value!r} is not a quantity this reader knows")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


def cpu_shares(milli: int) -> int:
    """The kubelet's MilliCPUToShares: a CPU request as cgroup CPU shares (min 2)."""
    return max(2, milli * 1024 // 1000)


# ------------------------------------------------------------------------- volumes

_LAYOUT = rf"""set -eu
src=$1 dst=$2 mode=$3 optional=$4 name=$5
mkdir -p "$dst/{DATA_DIR}"
if [ -d "$src" ]; then
  for f in "$src"/*; do
    [ -f "$f" ] || continue
    k=${{f##*/}}
    install -m "$mode" "$f" "$dst/{DATA_DIR}/$k"
    ln -sfn "..data/$k" "$dst/$k"
  done
elif [ "$optional" != true ]; then
  echo "kube-podman: $name: no directory $src (the kubelet would wait for it)" >&2
  exit 1
fi
ln -sfn {DATA_DIR} "$dst/..data"
"""


@dataclass
class _Volumes:
    """The pod's volumes: each one's host directory and the commands that make it."""

    pod_dir: str
    sources: Mapping[str, str]
    prepare: list[list[str]] = field(default_factory=list)
    remove: list[list[str]] = field(default_factory=list)
    host: dict[str, str] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    #: "configMap NAME" / "secret NAME" of a volume of either kind
    objects: dict[str, str] = field(default_factory=dict)

    def add(self, volume: Mapping[str, Any], where: str) -> None:
        name = volume["name"]
        kinds = [k for k in volume if k != "name"]
        if len(kinds) != 1 or kinds[0] not in VOLUME_FIELDS:
            raise Unmappable(f"{where}: volume {name!r}: kind {', '.join(kinds) or '(none)'} "
                             f"is not mapped to podman (kube_podman knows "
                             f"{', '.join(VOLUME_FIELDS)})")
        kind = kinds[0]
        body = volume[kind] or {}
        _unknown(body, VOLUME_FIELDS[kind], f"{where}.{kind}")
        self.kind[name] = kind
        if kind == "hostPath":
            self._host_path(name, body, where)
            return
        path = f"{self.pod_dir}/volumes/{name}"
        self.host[name] = path
        if kind == "emptyDir":
            self.prepare.append(["mkdir", "-p", path])
            if body.get("medium", "") == "Memory":
                size = ([f"size={int(quantity(body['sizeLimit'], where + '.emptyDir.sizeLimit'))}"]
                        if "sizeLimit" in body else [])
                self.prepare.append(["mount", "-t", "tmpfs", *(["-o", *size] if size else []),
                                     "tmpfs", path])
                self.remove.append(["umount", path])
            elif body.get("medium", "") != "":
                raise Unmappable(f"{where}.emptyDir.medium: {body['medium']!r} is not "
                                 f"mapped to podman (\"\" or Memory)")
            self.prepare.append(["chmod", "0777", path])
            self.remove.append(["rm", "-rf", path])
            return
        # configMap or secret: the kubelet's atomic-writer layout, filled from the
        # caller's directory for that object.
        obj = body["name"] if kind == "configMap" else body["secretName"]
        mode = body.get("defaultMode", 0o644)
        optional = bool(body.get("optional", False))
        self.objects[name] = f"{kind} {obj}"
        src = self.sources.get(obj)
        if src is None and not optional:
            raise Unmappable(f"{where}.{kind}: {obj!r}: no directory of its keys was "
                             f"given (--config-dir, --secret-dir or --source {obj}=DIR)")
        self.prepare.append(["mkdir", "-p", path])
        if kind == "secret":  # (the kubelet keeps Secrets in memory)
            self.prepare.append(["mount", "-t", "tmpfs", "tmpfs", path])
            self.remove.append(["umount", path])
        self.prepare.append(["sh", "-c", _LAYOUT, "kube-podman", src or "/nonexistent",
                             path, f"{mode:04o}", "true" if optional else "false",
                             f"{kind} {obj}"])
        self.remove.append(["rm", "-rf", path])

    def _host_path(self, name: str, body: Mapping[str, Any], where: str) -> None:
        path, kind = body["path"], body.get("type", "")
        if kind not in HOST_PATH_TYPES:
            raise Unmappable(f"{where}.hostPath.type: {kind!r} is not mapped to podman")
        if kind == "DirectoryOrCreate":
            self.prepare.append(["mkdir", "-p", path])
        elif kind == "FileOrCreate":
            self.prepare.append(["sh", "-c", 'mkdir -p "${1%/*}" && touch -a "$1"',
                                 "kube-podman", path])
        elif HOST_PATH_TYPES[kind]:
            self.prepare.append(["test", HOST_PATH_TYPES[kind], path])
        self.host[name] = path

    def bind(self, mount: Mapping[str, Any], env: Mapping[str, str], privileged: bool,
             where: str) -> str:
        """A volume mount as podman's ``-v`` value."""
        _unknown(mount, MOUNT_FIELDS, where)
        name = mount["name"]
        if name not in self.host:
            raise Unmappable(f"{where}.name: no volume {name!r} in the pod's volumes")
        source = self.host[name]
        sub = km.sub_path(mount, env)
        if sub:
            if sub.startswith("/") or ".." in PurePosixPath(sub).parts:
                raise Unmappable(f"{where}: subPath {sub!r} leaves the volume")
            if self.kind[name] in ("configMap", "secret"):
                # The key's file itself (the kubelet resolves KEY -> ..data/KEY). A key
                # the object lacks: the kubelet starts no container (or mounts an
                # empty directory), and the agent would refuse that anyway.
                source = f"{source}/{DATA_DIR}/{sub}"
                self.prepare.append(
                    ["sh", "-c", 'test -f "$1" || { echo "kube-podman: $2 has no key $3 '
                     '(for $4)" >&2; exit 1; }', "kube-podman", source,
                     self.objects[name], sub, where])
            else:
                source = f"{source}/{sub}"
        propagation = mount.get("mountPropagation") or "None"
        if propagation not in PROPAGATION:
            raise Unmappable(f"{where}.mountPropagation: {propagation!r} is not one of "
                             f"{', '.join(PROPAGATION)}")
        if propagation == "Bidirectional" and not privileged:
            raise Unmappable(f"{where}.mountPropagation: Bidirectional needs a privileged "
                             f"container (Kubernetes refuses it otherwise)")
        target = mount["mountPath"]
        for p in (source, target):
            if ":" in p or "," in p:
                raise Unmappable(f"{where}: {p!r}: podman's -v cannot carry ':' or ','")
        ro = "ro" if mount.get("readOnly", False) else "rw"
        return f"{source}:{target}:{ro},rbind,{PROPAGATION[propagation]}"


# ------------------------------------------------------------------------- the pod

def pod_plan(spec: Mapping[str, Any], *, pod: str, node: str,
             labels: Mapping[str, str] | None = None,
             sources: Mapping[str, str] | None = None, work_dir: str = WORK_DIR,
             image: str | None = None, where: str = "spec") -> Plan:
    """A pod spec (``where``: its path in the manifest, for errors) on ``node`` as
    podman commands. ``sources``: a directory of its keys as files for each ConfigMap
    and Secret the pod mounts, by the object's name. ``image``: instead of each
    container's (to run another build)."""
    notes: list[str] = []
    for key in spec:
        if key in POD_NOT_AT_RUN_TIME:
            continue
        if key not in POD_MAPPED:
            _unknown([key], POD_MAPPED | set(POD_NOT_AT_RUN_TIME), where)
    if spec.get("automountServiceAccountToken", True) is not False:
        raise Unmappable(f"{where}.automountServiceAccountToken: the kubelet would mount "
                         f"a service account token, which needs an API server "
                         f"(set it to false)")
    restart = spec.get("restartPolicy", "Always")
    if restart not in RESTART:
        raise Unmappable(f"{where}.restartPolicy: {restart!r}")
    grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE))

    pod_flags: list[str] = []
    if spec.get("hostNetwork", False):
        pod_flags += ["--network=host", "--uts=host"]
        if "dnsPolicy" in spec:
            notes.append(f"{where}.dnsPolicy: {spec['dnsPolicy']}: cluster DNS exists only "
                         f"in a cluster; the host's resolv.conf is used (host network)")
    else:
        pod_flags += ["--network=none", f"--hostname={pod}"]
        notes.append(f"{where}.hostNetwork: false: a pod network exists only in a "
                     f"cluster; --network=none (a loopback only)")
        if "dnsPolicy" in spec:
            notes.append(f"{where}.dnsPolicy: {spec['dnsPolicy']}: no network, no DNS")
    if spec.get("hostPID", False):
        pod_flags.append("--pid=host")
    if spec.get("hostIPC", False):
        pod_flags.append("--ipc=host")
    notes.append("KUBERNETES_SERVICE_HOST, KUBERNETES_PORT, ...: the kubelet's variables "
                 "for the API server's Service; no cluster, none here")
    notes.append("/dev/termination-log: the file the kubelet mounts for a container's last "
                 "words (terminationMessagePath); not mounted here")
    # The kubelet's OOM score: a node-critical pod's containers get the guaranteed one;
    # another pod's depends on its QoS class and the node's memory.
    if spec.get("priorityClassName") == "system-node-critical":
        pod_flags.append(f"--oom-score-adj={NODE_CRITICAL_OOM_SCORE_ADJ}")
    else:
        notes.append(f"{where}.priorityClassName: {spec.get('priorityClassName')}: the "
                     f"kubelet's OOM score of a pod that is not node-critical depends on "
                     f"the node's memory; podman's default here")

    volumes = _Volumes(f"{work_dir}/{pod}", dict(sources or {}))
    names = set()
    for i, v in enumerate(spec.get("volumes") or []):
        if v["name"] in names:
            raise Unmappable(f"{where}.volumes[{i}].name: {v['name']!r} twice")
        names.add(v["name"])
        volumes.add(v, f"{where}.volumes[{i}]")

    runs = []
    for init, key in ((True, "initContainers"), (False, "containers")):
        for i, c in enumerate(spec.get(key) or []):
            runs.append(_container_run(c, pod=pod, node=node, init=init, labels=labels or {},
                                       pod_flags=pod_flags, volumes=volumes, grace=grace,
                                       restart=RESTART[restart], image=image, notes=notes,
                                       where=f"{where}.{key}[{i}]"))
    if not any(not r.init for r in runs):
        raise Unmappable(f"{where}.containers: none")
    remove = [cmd for r in runs if not r.init
              for cmd in (["podman", "stop", "--time", str(grace), r.name],
                          ["podman", "rm", r.name])]
    return Plan(pod, node, volumes.prepare, runs, remove + volumes.remove, notes)


def _container_run(c: Mapping[str, Any], *, pod: str, node: str, init: bool,
                   labels: Mapping[str, str], pod_flags: Sequence[str], volumes: _Volumes,
                   grace: int, restart: str, image: str | None, notes: list[str],
                   where: str) -> Run:
    _unknown(c, CONTAINER_FIELDS, where)
    cname = c["name"]
    name = pod if cname == pod else f"{pod}-{cname}"
    # The environment as the kubelet makes it (fieldRef resolved, $(VAR) expanded).
    env = _environment(c, node, where)
    sec = c.get("securityContext") or {}
    _unknown(sec, SECURITY_FIELDS, f"{where}.securityContext")
    privileged = bool(sec.get("privileged", False))

    argv = ["podman", "run", f"--name={name}"]
    argv += ["--rm"] if init else ["--detach", f"--restart={restart}"]
    argv += [f"--stop-timeout={grace}", *pod_flags]
    for k, v in sorted(labels.items()):
        argv.append(f"--label={k}={v}")
    argv += [f"--label=io.kubernetes.pod.name={pod}",
             f"--label=io.kubernetes.container.name={cname}"]
    policy = c.get("imagePullPolicy")
    ref = image or c["image"]
    if policy is None:  # Kubernetes' default
        policy = "Always" if ref.endswith(":latest") or ":" not in ref.rsplit("/", 1)[-1] \
            else "IfNotPresent"
    if policy not in PULL:
        raise Unmappable(f"{where}.imagePullPolicy: {policy!r}")
    argv.append(f"--pull={PULL[policy]}")

    # securityContext
    if privileged:
        argv.append("--privileged")
    else:
        argv.append("--security-opt=seccomp=unconfined")
    if "runAsUser" in sec or "runAsGroup" in sec:
        user = str(sec.get("runAsUser", 0))
        argv.append(f"--user={user}:{sec['runAsGroup']}" if "runAsGroup" in sec
                    else f"--user={user}")
    if sec.get("allowPrivilegeEscalation") is False:
        argv.append("--security-opt=no-new-privileges")
    if sec.get("readOnlyRootFilesystem", False):
        argv += ["--read-only", "--read-only-tmpfs=false"]
    caps = sec.get("capabilities") or {}
    _unknown(caps, {"add", "drop"}, f"{where}.securityContext.capabilities")
    argv += [f"--cap-drop={cap.lower()}" for cap in caps.get("drop") or []]
    argv += [f"--cap-add={cap.lower()}" for cap in caps.get("add") or []]

    # resources
    res = c.get("resources") or {}
    _unknown(res, {"requests", "limits"}, f"{where}.resources")
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    _unknown(requests, {"cpu", "memory"}, f"{where}.resources.requests")
    _unknown(limits, {"cpu", "memory"}, f"{where}.resources.limits")
    milli = round(quantity(requests.get("cpu", limits.get("cpu", 0)),
                           f"{where}.resources.requests.cpu") * 1000)
    argv.append(f"--cpu-shares={cpu_shares(milli)}")
    if "cpu" in limits:
        argv.append(f"--cpus={quantity(limits['cpu'], where + '.resources.limits.cpu'):g}")
    if "memory" in limits:
        memory = quantity(limits["memory"], f"{where}.resources.limits.memory")
        argv.append(f"--memory={int(memory)}")
    if "memory" in requests:
        notes.append(f"{where}.resources.requests.memory: scheduling only (no cgroup "
                     f"setting without the kubelet's MemoryQoS)")

    if "readinessProbe" in c:
        notes.append(f"{where}.readinessProbe: readiness only, nothing restarts on it; "
                     f"ask it yourself: {_probe(c['readinessProbe'], where)}")

    for k, v in env.items():
        argv.append(f"--env={k}={v}")
    if "workingDir" in c:
        argv.append(f"--workdir={c['workingDir']}")
    # Parents before their children (/sys before /sys/kernel/config), as the CRI
    # runtime orders them (containerd sorts the mounts by their paths' depth): a mount
    # never hides one below it. Otherwise in the manifest's order.
    binds = [(len(PurePosixPath(m["mountPath"]).parts),
              volumes.bind(m, env, privileged, f"{where}.volumeMounts[{i}]"))
             for i, m in enumerate(c.get("volumeMounts") or [])]
    for _, bind in sorted(binds, key=lambda b: b[0]):
        argv += ["-v", bind]

    command = [km.expand(str(a), env) for a in c.get("command") or []]
    args = [km.expand(str(a), env) for a in c.get("args") or []]
    if command:
        argv.append("--entrypoint=" + json.dumps(command))
    argv.append(ref)
    argv += args
    return Run(cname, name, init, argv)


def _environment(c: Mapping[str, Any], node: str, where: str) -> dict[str, str]:
    for i, var in enumerate(c.get("env") or []):
        _unknown(var, {"name", "value", "valueFrom"}, f"{where}.env[{i}]")
    try:
        return km.environment({"spec": {"template": {"spec": {"containers": [c]}}}},
                              node, c["name"])
    except ValueError as e:
        raise Unmappable(f"{where}.env: {e}") from e


def _probe(probe: Mapping[str, Any], where: str) -> str:
    if "httpGet" in probe:
        h = probe["httpGet"]
        return (f"curl -fsS {h.get('scheme', 'HTTP').lower()}://{h.get('host', '127.0.0.1')}:"
                f"{h['port']}{h.get('path', '/')}")
    if "exec" in probe:
        return shlex.join(probe["exec"]["command"])
    raise Unmappable(f"{where}.readinessProbe: a probe this reader does not know")


# ------------------------------------------------------------------- entry points

def daemonset_plan(daemonset: Mapping[str, Any], node: str, *,
                   sources: Mapping[str, str] | None = None, work_dir: str = WORK_DIR,
                   image: str | None = None, pod: str | None = None) -> Plan:
    """A DaemonSet's pod on ``node`` as podman commands (the pod is named after the
    DaemonSet unless ``pod`` says otherwise: one per node)."""
    template = daemonset["spec"]["template"]
    return pod_plan(km.pod_spec(daemonset), pod=pod or daemonset["metadata"]["name"],
                    node=node, labels=(template.get("metadata") or {}).get("labels") or {},
                    sources=sources, work_dir=work_dir, image=image,
                    where="spec.template.spec")


def single_source(daemonset: Mapping[str, Any], kind: str) -> str:
    """The name of the one ConfigMap (``kind`` configMap) or Secret (secret) the
    DaemonSet's pod mounts."""
    key = "name" if kind == "configMap" else "secretName"
    found = {v[kind][key] for v in km.pod_spec(daemonset).get("volumes") or [] if kind in v}
    if len(found) != 1:
        raise Unmappable(f"spec.template.spec.volumes: {len(found)} {kind} volumes "
                         f"(name each one's directory with --source NAME=DIR)")
    return found.pop()


def engine_pod(gpu_daemonset: Mapping[str, Any], *, image: str, command: Sequence[str],
               name: str = "engine", pools: str | None = None,
               render: str | None = None) -> dict[str, Any]:
    """The pod spec of an inference engine on a GPU node, as docs/kubernetes.md
    ("Engine pods") describes it: the pools' mount root of the GPU DaemonSet (its one
    Bidirectional host path, or ``pools``) with HostToContainer propagation, read-write,
    and the directory of kvagent's rendered engine configs (``render``; default
    <state_dir>/engines, the state_dir's host path of the DaemonSet) read-only; each at
    the same path inside. Unprivileged, no host pod_flags."""
    mounts = km.host_mounts(gpu_daemonset)
    if pools is None:
        shared = [m for m in mounts if m.propagation == "Bidirectional"]
        if len(shared) != 1:
            raise Unmappable(f"the GPU DaemonSet has {len(shared)} Bidirectional host "
                             f"paths: name the pools' root (pools=)")
        pools = shared[0].host_path
    if render is None:
        state = [m for m in mounts if m.container_path == STATE_DIR]
        if len(state) != 1:
            raise Unmappable(f"the GPU DaemonSet mounts no host path at {STATE_DIR}")
        render = f"{state[0].host_path}/{ENGINES_SUBDIR}"
    return {
        "restartPolicy": "Always",
        "automountServiceAccountToken": False,
        "containers": [{
            "name": name,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": list(command),
            "volumeMounts": [
                {"name": "kvcache", "mountPath": pools, "mountPropagation": "HostToContainer"},
                {"name": "kvagent-render", "mountPath": render, "readOnly": True},
            ],
        }],
        "volumes": [
            {"name": "kvcache", "hostPath": {"path": pools, "type": "Directory"}},
            {"name": "kvagent-render", "hostPath": {"path": render, "type": "Directory"}},
        ],
    }
