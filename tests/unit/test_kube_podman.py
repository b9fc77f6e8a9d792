"""scripts/kube_podman.py: the DaemonSets' pods as the podman commands the kubelet's
work amounts to, generated from the manifests themselves.

For both DaemonSets the agent's ``podman run`` has a ``-v`` for every volume mount, each
hostPath with its propagation (None / HostToContainer / Bidirectional -> rprivate /
rslave / rshared) and read-only flag, the pod's privileges and host namespaces, the
container's environment on the node, its command and grace; the keys init container
shares the in-memory emptyDir with the agent; the ConfigMap and Secret are laid out as
the kubelet lays them out (run here on a temporary directory). A field the mapping does
not know, a mount of a volume that does not exist, a privilege it cannot grant, are
refused with the field's path. Edited manifests give edited commands (the generator
reads the manifest, not a copy). The engine pod mounts the GPU DaemonSet's pools' root
HostToContainer and the rendered configs read-only. Nothing here runs podman.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.machinery
import importlib.util
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from agent.config.model import NodeConfig
from agent.records import ENGINES_DIR

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
NODE = "node-a"


def _load(name: str, path: Path) -> ModuleType:
    """A module of scripts/ (not of the agent), once per process."""
    if name in sys.modules:
        return sys.modules[name]
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up; kube_podman imports it)
    loader.exec_module(module)
    return module


km = _load("kube_manifest", SCRIPTS / "kube_manifest.py")
kp = _load("kube_podman", SCRIPTS / "kube_podman.py")
cli = _load("kube_podman_cli", SCRIPTS / "kube-podman")

DAEMONSETS = km.daemonsets(km.load())


def _flags(argv: list[str]) -> list[str]:
    """The options before the image (a run's argv: podman run OPTIONS IMAGE ARGS)."""
    out, i = [], 2
    while i < len(argv):
        if argv[i] == "-v":
            out.append("-v=" + argv[i + 1])
            i += 2
        elif argv[i].startswith("-"):
            out.append(argv[i])
            i += 1
        else:
            break
    return out


def _binds(argv: list[str]) -> dict[str, tuple[str, set[str]]]:
    """A run's ``-v`` values: container path -> (host path, options)."""
    out = {}
    for f in _flags(argv):
        if f.startswith("-v="):
            host, target, opts = f[3:].split(":")
            assert target not in out, f"{target} mounted twice"
            out[target] = (host, set(opts.split(",")))
    return out


def _env(argv: list[str]) -> dict[str, str]:
    return dict(f.removeprefix("--env=").split("=", 1) for f in _flags(argv)
                if f.startswith("--env="))


def _image_and_args(argv: list[str]) -> list[str]:
    return argv[2 + len([x for f in _flags(argv) for x in (f.split("=", 1)
                         if f.startswith("-v=") else [f])]):]


def _sources(tmp_path: Path, ds: dict[str, Any]) -> dict[str, str]:
    """A directory of keys for the DaemonSet's ConfigMap (this node's config) and
    Secret."""
    config = tmp_path / "config"
    config.mkdir(parents=True)
    (config / f"{NODE}.yaml").write_text("version: 1\n")
    (config / "other-node.yaml").write_text("version: 1\n")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / f"{NODE}.dhchap.key").write_text("DHHC-1:00:x:\n")
    return {kp.single_source(ds, "configMap"): str(config),
            kp.single_source(ds, "secret"): str(secret)}


def _plan(ds: dict[str, Any], tmp_path: Path) -> Any:
    return kp.daemonset_plan(ds, NODE, sources=_sources(tmp_path, ds),
                             work_dir=str(tmp_path / "work"))


def _agent_run(plan: Any) -> Any:
    runs = [r for r in plan.runs if r.container == km.AGENT_CONTAINER]
    assert len(runs) == 1 and not runs[0].init
    return runs[0]


@pytest.fixture(params=sorted(DAEMONSETS))
def daemonset(request: pytest.FixtureRequest) -> dict[str, Any]:
    return copy.deepcopy(DAEMONSETS[request.param])


def test_both_daemonsets_are_read() -> None:
    assert sorted(km.role(d) for d in DAEMONSETS.values()) == ["gpu", "storage"]


def test_every_host_path_is_mounted_with_its_propagation_and_read_only_flag(
        daemonset: dict[str, Any], tmp_path: Path) -> None:
    run = _agent_run(_plan(daemonset, tmp_path))
    binds = _binds(run.argv)
    host_mounts = km.host_mounts(daemonset)
    assert host_mounts, "the agent mounts host paths"
    expected = {"None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
    for m in host_mounts:
        assert m.container_path in binds, f"{m.volume}: no -v for {m.container_path}"
        host, opts = binds[m.container_path]
        assert host == m.host_path
        assert opts == {"ro" if m.read_only else "rw", "rbind", expected[m.propagation]}, m
    # and nothing else: one -v per volume mount of the container
    assert len(binds) == len(km.mounts(daemonset))
    # The manifest's Bidirectional and HostToContainer mounts are there as such.
    props = {m.container_path: m.propagation for m in host_mounts}
    assert props["/dev"] == "HostToContainer" and "rslave" in binds["/dev"][1]
    assert "ro" in binds["/lib/modules"][1] and "ro" in binds["/run/udev"][1]
    if km.role(daemonset) == "gpu":
        assert "rshared" in binds["/var/lib/kvcache"][1]


def test_parents_are_mounted_before_their_children(daemonset: dict[str, Any],
                                                   tmp_path: Path) -> None:
    targets = list(_binds(_agent_run(_plan(daemonset, tmp_path)).argv))
    assert targets.index("/sys") < targets.index("/sys/kernel/config")
    depths = [len(Path(t).parts) for t in targets]
    assert depths == sorted(depths)


def test_privileges_namespaces_grace_and_command_match_the_manifest(
        daemonset: dict[str, Any], tmp_path: Path) -> None:
    plan = _plan(daemonset, tmp_path)
    pod = km.pod_spec(daemonset)
    for run in plan.runs:
        c = km.container(daemonset, run.container)
        flags = _flags(run.argv)
        # A pod's containers share its namespaces: the init container too.
        assert ("--network=host" in flags) == bool(pod.get("hostNetwork"))
        assert ("--uts=host" in flags) == bool(pod.get("hostNetwork"))
        assert ("--pid=host" in flags) == bool(pod.get("hostPID"))
        assert ("--ipc=host" in flags) == bool(pod.get("hostIPC"))
        # The kubelet's OOM score of a node-critical pod's containers.
        assert pod["priorityClassName"] == "system-node-critical"
        assert "--oom-score-adj=-997" in flags
        privileged = bool((c.get("securityContext") or {}).get("privileged"))
        assert ("--privileged" in flags) == privileged
        assert f"--stop-timeout={pod['terminationGracePeriodSeconds']}" in flags
        assert f"--name={run.name}" in flags
        assert "--replace" not in flags  # an existing container is an error, not replaced
        assert flags.count("--pull=missing") == 1  # IfNotPresent
        image, *args = _image_and_args(run.argv)
        assert image == c["image"]
        assert f"--entrypoint={json.dumps(c['command'])}" in flags
        assert args == [km.expand(a, km.environment(daemonset, NODE, run.container))
                        for a in c.get("args") or []]
        if run.init:
            assert "--rm" in flags and "--detach" not in flags
        else:
            assert "--detach" in flags and "--restart=always" in flags
    agent = _agent_run(plan)
    assert _image_and_args(agent.argv) == [f"localhost/kvagent:{_version()}"]
    assert "--cpu-shares=102" in _flags(agent.argv)  # requests.cpu 100m, as the kubelet
    keys = next(r for r in plan.runs if r.init and r.container == "keys")
    flags = _flags(keys.argv)
    assert {"--cap-drop=all", "--read-only", "--read-only-tmpfs=false", "--user=0",
            "--security-opt=no-new-privileges", "--security-opt=seccomp=unconfined"} \
        <= set(flags)
    assert plan.runs.index(keys) < plan.runs.index(agent)


def _version() -> str:
    from agent import __version__
    return __version__


def test_environment_is_the_containers_on_the_node(daemonset: dict[str, Any],
                                                   tmp_path: Path) -> None:
    plan = _plan(daemonset, tmp_path)
    for run in plan.runs:
        assert _env(run.argv) == km.environment(daemonset, NODE, run.container)
    assert _env(_agent_run(plan).argv)["NODE_NAME"] == NODE
    keys = next(r for r in plan.runs if r.container == "keys")
    assert _env(keys.argv)["KEY_PREFIX"] == (f"{NODE}." if km.role(daemonset) == "gpu"
                                             else "")


def test_config_and_keys_reach_the_agent_as_the_kubelet_gives_them(
        daemonset: dict[str, Any], tmp_path: Path) -> None:
    plan = _plan(daemonset, tmp_path)
    pod_dir = tmp_path / "work" / daemonset["metadata"]["name"] / "volumes"
    binds = _binds(_agent_run(plan).argv)
    # The node's key of the ConfigMap, the file itself (subPathExpr), read-only.
    host, opts = binds["/etc/kvagent/kvagent.yaml"]
    assert host == f"{pod_dir}/config/{kp.DATA_DIR}/{NODE}.yaml" and "ro" in opts
    # The in-memory emptyDir: the init container writes it, the agent reads it.
    keys = next(r for r in plan.runs if r.container == "keys")
    assert _binds(keys.argv)["/etc/kvagent/keys"] == (f"{pod_dir}/keys",
                                                      {"rw", "rbind", "rprivate"})
    assert binds["/etc/kvagent/keys"] == (f"{pod_dir}/keys", {"ro", "rbind", "rprivate"})
    assert ["mount", "-t", "tmpfs", "-o", "size=1048576", "tmpfs", f"{pod_dir}/keys"] \
        in plan.prepare
    assert _binds(keys.argv)["/run/kvagent-secret"][0] == f"{pod_dir}/secret-keys"
    assert ["mount", "-t", "tmpfs", "tmpfs", f"{pod_dir}/secret-keys"] in plan.prepare
    # Deleting the pod: the agent stopped within its grace, then the volumes go.
    grace = str(km.pod_spec(daemonset)["terminationGracePeriodSeconds"])
    assert plan.remove[0] == ["podman", "stop", "--time", grace, _agent_run(plan).name]
    assert ["umount", f"{pod_dir}/keys"] in plan.remove


def test_host_path_types_are_checked_or_made_first(daemonset: dict[str, Any],
                                                   tmp_path: Path) -> None:
    plan = _plan(daemonset, tmp_path)
    for v in km.pod_spec(daemonset)["volumes"]:
        if "hostPath" not in v:
            continue
        path, kind = v["hostPath"]["path"], v["hostPath"].get("type", "")
        want = {"Directory": ["test", "-d", path],
                "DirectoryOrCreate": ["mkdir", "-p", path]}[kind]
        assert want in plan.prepare, v


def test_the_volume_layout_is_the_kubelets(daemonset: dict[str, Any],
                                           tmp_path: Path) -> None:
    """The ConfigMap's and Secret's layout commands, run here (without the tmpfs)."""
    plan = _plan(daemonset, tmp_path)
    work = str(tmp_path / "work")
    for cmd in plan.prepare:
        if cmd[0] != "mount" and any(a.startswith(work) for a in cmd):
            subprocess.run(cmd, check=True, capture_output=True)
    pod_dir = tmp_path / "work" / daemonset["metadata"]["name"] / "volumes"
    config = pod_dir / "config"
    assert (config / "..data").readlink() == Path(kp.DATA_DIR)
    assert (config / f"{NODE}.yaml").readlink() == Path(f"..data/{NODE}.yaml")
    mode = km.volume(daemonset, "config")["configMap"]["defaultMode"]
    real = config / kp.DATA_DIR / f"{NODE}.yaml"
    assert real.is_file() and not real.is_symlink()
    assert stat.S_IMODE(real.stat().st_mode) == mode == 0o444
    secret = pod_dir / "secret-keys" / kp.DATA_DIR / f"{NODE}.dhchap.key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o400
    assert stat.S_IMODE((pod_dir / "keys").stat().st_mode) == 0o777


def test_a_node_without_a_config_key_does_not_start(daemonset: dict[str, Any],
                                                    tmp_path: Path) -> None:
    sources = _sources(tmp_path, daemonset)
    plan = kp.daemonset_plan(daemonset, "node-without-key", sources=sources,
                             work_dir=str(tmp_path / "work"))
    script = tmp_path / "prepare.sh"
    lines = [c for c in plan.prepare if c[0] != "mount"
             and any(a.startswith(str(tmp_path / "work")) for a in c)]
    script.write_text("set -e\n" + "\n".join(map(_shell, lines)) + "\n")
    r = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert r.returncode != 0
    assert "has no key node-without-key.yaml" in r.stderr


def _shell(cmd: list[str]) -> str:
    import shlex
    return shlex.join(cmd)


def test_the_secret_is_optional_the_configmap_is_not(daemonset: dict[str, Any],
                                                     tmp_path: Path) -> None:
    config = kp.single_source(daemonset, "configMap")
    plan = kp.daemonset_plan(daemonset, NODE, sources={config: str(tmp_path)},
                             work_dir=str(tmp_path / "work"))
    assert any(r.container == "keys" for r in plan.runs)
    with pytest.raises(kp.Unmappable, match=rf"configMap: '{config}': no directory"):
        kp.daemonset_plan(daemonset, NODE, sources={}, work_dir=str(tmp_path / "work"))


# ------------------------------------------------------------------ refusals

def _volume_index(ds: dict[str, Any], name: str) -> int:
    return next(i for i, v in enumerate(km.pod_spec(ds)["volumes"]) if v["name"] == name)


def test_an_unknown_volume_kind_is_refused_by_name(daemonset: dict[str, Any],
                                                   tmp_path: Path) -> None:
    i = _volume_index(daemonset, "state")
    km.pod_spec(daemonset)["volumes"][i] = {"name": "state",
                                           "nfs": {"server": "x", "path": "/"}}
    with pytest.raises(kp.Unmappable,
                       match=rf"spec\.template\.spec\.volumes\[{i}\]: volume 'state': "
                             r"kind nfs is not mapped"):
        _plan(daemonset, tmp_path)


def test_a_mount_of_a_missing_volume_is_refused_by_name(daemonset: dict[str, Any],
                                                        tmp_path: Path) -> None:
    mounts = km.container(daemonset)["volumeMounts"]
    j = next(j for j, m in enumerate(mounts) if m["name"] == "etc-nvme")
    i = _volume_index(daemonset, "etc-nvme")
    del km.pod_spec(daemonset)["volumes"][i]
    with pytest.raises(kp.Unmappable,
                       match=rf"containers\[0\]\.volumeMounts\[{j}\]\.name: no volume "
                             r"'etc-nvme'"):
        _plan(daemonset, tmp_path)


@pytest.mark.parametrize("edit, field", [
    (lambda ds: km.container(ds).__setitem__("lifecycle", {"preStop": {}}),
     r"containers\[0\]\.lifecycle"),
    (lambda ds: km.container(ds).__setitem__("livenessProbe", {"httpGet": {"port": 1}}),
     r"containers\[0\]\.livenessProbe"),
    (lambda ds: km.container(ds)["securityContext"].__setitem__("seLinuxOptions", {}),
     r"containers\[0\]\.securityContext\.seLinuxOptions"),
    (lambda ds: km.container(ds)["volumeMounts"][0].__setitem__("recursiveReadOnly",
                                                               "Enabled"),
     r"volumeMounts\[0\]\.recursiveReadOnly"),
    (lambda ds: km.pod_spec(ds).__setitem__("shareProcessNamespace", True),
     r"spec\.template\.spec\.shareProcessNamespace"),
    (lambda ds: km.pod_spec(ds).__delitem__("automountServiceAccountToken"),
     r"spec\.template\.spec\.automountServiceAccountToken"),
    (lambda ds: km.volume(ds, "config")["configMap"].__setitem__(
        "items", [{"key": "a", "path": "b"}]), r"\.configMap\.items"),
    (lambda ds: km.volume(ds, "state")["hostPath"].__setitem__("type", "Weird"),
     r"\.hostPath\.type: 'Weird'"),
    (lambda ds: km.volume(ds, "keys")["emptyDir"].__setitem__("medium", "HugePages"),
     r"\.emptyDir\.medium: 'HugePages'"),
    (lambda ds: km.container(ds)["env"].append(
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
     r"containers\[0\]\.env: .*env X"),
    (lambda ds: km.container(ds)["volumeMounts"][0].__setitem__("mountPropagation", "Up"),
     r"volumeMounts\[0\]\.mountPropagation: 'Up'"),
])
def test_a_field_it_cannot_map_is_refused_by_name(daemonset: dict[str, Any], tmp_path: Path,
                                                  edit: Any, field: str) -> None:
    edit(daemonset)
    with pytest.raises(kp.Unmappable, match=field):
        _plan(daemonset, tmp_path)


def test_bidirectional_needs_a_privileged_container(daemonset: dict[str, Any],
                                                   tmp_path: Path) -> None:
    keys = km.container(daemonset, "keys")
    keys["volumeMounts"][1]["mountPropagation"] = "Bidirectional"
    with pytest.raises(kp.Unmappable, match=r"initContainers\[0\]\.volumeMounts\[1\]\."
                                            r"mountPropagation: Bidirectional needs"):
        _plan(daemonset, tmp_path)


# ------------------------------------------------- the manifest, not a copy of it

def test_a_changed_propagation_changes_the_run(daemonset: dict[str, Any],
                                               tmp_path: Path) -> None:
    before = _binds(_agent_run(_plan(daemonset, tmp_path / "a")).argv)["/dev"]
    for m in km.container(daemonset)["volumeMounts"]:
        if m["mountPath"] == "/dev":
            m["mountPropagation"] = "Bidirectional"
        if m["mountPath"] == "/etc/nvme":
            m["readOnly"] = True
    after = _binds(_agent_run(_plan(daemonset, tmp_path / "b")).argv)
    assert before[1] == {"rw", "rbind", "rslave"}
    assert after["/dev"][1] == {"rw", "rbind", "rshared"}
    assert after["/etc/nvme"][1] == {"ro", "rbind", "rprivate"}


def test_the_command_line_reads_the_manifest_files(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    manifests = tmp_path / "manifests"
    shutil.copytree(km.MANIFESTS, manifests)
    config = tmp_path / "config"
    config.mkdir()
    (config / f"{NODE}.yaml").write_text("version: 1\n")

    def run() -> dict[str, Any]:
        assert cli.main(["daemonset", "gpu", "--node", NODE, "--manifests", str(manifests),
                         "--config-dir", str(config), "--work-dir", str(tmp_path / "w")]) == 0
        return json.loads(capsys.readouterr().out)

    def dev(plan: dict[str, Any]) -> str:
        return next(a for a in plan["runs"][-1]["argv"] if a.startswith("/dev:"))

    assert dev(run()) == "/dev:/dev:rw,rbind,rslave"
    path = manifests / "11-daemonset-gpu.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    for m in docs[0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]:
        if m["mountPath"] == "/dev":
            m["mountPropagation"] = "None"
    path.write_text(yaml.safe_dump_all(docs))
    assert dev(run()) == "/dev:/dev:rw,rbind,rprivate"
    # A field it cannot map: exit 2, the field named on stderr, nothing on stdout.
    docs[0]["spec"]["template"]["spec"]["volumes"].append({"name": "x", "csi": {}})
    path.write_text(yaml.safe_dump_all(docs))
    assert cli.main(["daemonset", "kvagent-gpu", "--node", NODE, "--manifests",
                     str(manifests), "--config-dir", str(config)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "volume 'x': kind csi is not mapped" in out.err


def test_the_shell_scripts(daemonset: dict[str, Any], tmp_path: Path) -> None:
    plan = _plan(daemonset, tmp_path)
    for remove in (False, True):
        script = plan.script(remove=remove)
        path = tmp_path / f"s{int(remove)}.sh"
        path.write_text(script)
        subprocess.run(["sh", "-n", str(path)], check=True)
        assert script.startswith("#!/bin/sh\n")
    start = plan.script()
    assert all(_shell(r.argv) in start for r in plan.runs)
    assert "podman stop --time" in plan.script(remove=True)


# ------------------------------------------------------------------ the engine pod

def test_the_engine_pod_mounts_the_pools_host_to_container_and_the_render_read_only(
        tmp_path: Path) -> None:
    gpu = next(d for d in DAEMONSETS.values() if km.role(d) == "gpu")
    # The agent's own defaults: where it renders the engines' configs.
    state_dir = {f.name: f.default for f in dataclasses.fields(NodeConfig)}["state_dir"]
    assert state_dir == kp.STATE_DIR and kp.ENGINES_SUBDIR == ENGINES_DIR
    spec = kp.engine_pod(gpu, image="localhost/kvagent:x", command=["sleep", "infinity"])
    plan = kp.pod_plan(spec, pod="engine", node=NODE, work_dir=str(tmp_path))
    (run,) = plan.runs
    binds = _binds(run.argv)
    pools = next(m for m in km.host_mounts(gpu) if m.propagation == "Bidirectional")
    assert pools.host_path == "/var/lib/kvcache"
    assert binds == {pools.container_path: (pools.host_path, {"rw", "rbind", "rslave"}),
                     "/var/lib/kvagent/engines": ("/var/lib/kvagent/engines",
                                                  {"ro", "rbind", "rprivate"})}
    flags = _flags(run.argv)
    assert "--privileged" not in flags and "--network=none" in flags
    assert not {"--pid=host", "--ipc=host", "--network=host"} & set(flags)
    assert not [f for f in flags if f.startswith("--oom-score-adj")]
    assert ["test", "-d", "/var/lib/kvcache"] in plan.prepare
    assert run.name == "engine"
    assert _image_and_args(run.argv) == ["localhost/kvagent:x"]
    assert '--entrypoint=["sleep", "infinity"]' in flags
    # The pools' root follows the manifest.
    edited = copy.deepcopy(gpu)
    km.volume(edited, "kvcache")["hostPath"]["path"] = "/srv/kv"
    for m in km.container(edited)["volumeMounts"]:
        if m["name"] == "kvcache":
            m["mountPath"] = "/srv/kv"
    spec = kp.engine_pod(edited, image="i", command=["true"])
    assert spec["volumes"][0]["hostPath"]["path"] == "/srv/kv"


def test_cpu_shares_and_quantities() -> None:
    assert kp.cpu_shares(100) == 102 and kp.cpu_shares(0) == 2 and kp.cpu_shares(1000) == 1024
    assert kp.quantity("1Mi", "x") == 1 << 20 and kp.quantity("100m", "x") == 0.1
    with pytest.raises(kp.Unmappable, match="x: '1Q'"):
        kp.quantity("1Q", "x")
