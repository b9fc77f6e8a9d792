"""The Ansible role and playbooks: lint, syntax, and what the role renders.

Everything here runs on the controller only and writes only under tmp_path:
ansible-lint (production profile, offline), ``ansible-playbook --syntax-check``,
the role's config tasks against the example inventory with a local connection
(the template's ``validate`` runs this checkout's ``kvagent config validate``),
its identity tasks against a scratch ``nvme_dir``, the source packer, and the
rolling upgrade's order and /readyz gate against stand-in health endpoints.
"""

from __future__ import annotations

import http.server
import os
import re
import subprocess
import sys
import tarfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
ROLE = ANSIBLE / "roles" / "kvagent"
EXAMPLE = ANSIBLE / "inventory" / "example"
VENV_BIN = Path(sys.executable).parent
STORAGE = ("stor-01", "stor-02")
GPUS = ("gpu-01", "gpu-02", "gpu-03")

needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="the identity tasks chown their files to root")


def _env(tmp: Path) -> dict[str, str]:
    """Ansible confined to tmp (no ~/.ansible), offline, uncoloured, this venv's tools."""
    env = dict(os.environ)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "HOME": str(tmp / "home"),
        "ANSIBLE_HOME": str(tmp / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": str(tmp / "ansible-remote"),
        "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "NO_COLOR": "1",
        "XDG_CACHE_HOME": str(tmp / "cache"),
        "ANSIBLE_LINT_OFFLINE": "1",
    })
    env.pop("ANSIBLE_CONFIG", None)
    (tmp / "home").mkdir(exist_ok=True)
    return env


def _run(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, env=_env(tmp), capture_output=True, text=True,
                          timeout=600, check=False)


def _playbook(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _run([str(VENV_BIN / "ansible-playbook"), *args], tmp)


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def _uuid_nqn() -> str:
    return f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}"


# --- lint and syntax ------------------------------------------------------------------


def _lint(path: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    return _run([str(VENV_BIN / "ansible-lint"), "--offline", "--profile", "production",
                 "-c", str(path / ".ansible-lint"), str(path)], tmp)


def test_ansible_lint_production_profile_passes(tmp_path: Path) -> None:
    result = _lint(ANSIBLE, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Profile 'production' was required, and it passed" in output, output


def test_ansible_lint_sees_the_role(tmp_path: Path) -> None:
    """The lint run above is not vacuous: a violation planted in the role fails it."""
    copy = tmp_path / "ansible"
    subprocess.run(["cp", "-a", str(ANSIBLE), str(copy)], check=True)
    with (copy / "roles/kvagent/tasks/platform.yml").open("a") as f:
        f.write("\n- name: Planted violation\n  ansible.builtin.command: echo hi\n")
    result = _lint(copy, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "no-changed-when" in output and "roles/kvagent/tasks/platform.yml" in output, output


@pytest.mark.parametrize(("playbook", "inventory"), [
    ("site.yml", "inventory/example"),
    ("upgrade.yml", "inventory/example"),
    ("tests/localhost.yml", "tests/inventory.yml"),
])
def test_playbook_syntax(tmp_path: Path, playbook: str, inventory: str) -> None:
    result = _playbook(tmp_path, "--syntax-check", "-i", str(ANSIBLE / inventory),
                       str(ANSIBLE / playbook))
    assert result.returncode == 0, result.stdout + result.stderr


# --- the rendered configuration ---------------------------------------------------------

RENDER_PLAY = """\
- name: Render kvagent.yaml with the role's config tasks
  hosts: {hosts}
  gather_facts: false
  vars:
    kvagent_install_method: venv
    kvagent_venv: {venv}
    kvagent_config_dir: {out}/{{{{ inventory_hostname }}}}
    kvagent_manage_service: false
  tasks:
    - name: Render
      ansible.builtin.import_role:
        name: kvagent
        tasks_from: config.yml
"""


def _render(tmp: Path, hosts: str, overlay: dict, inventory: Path = EXAMPLE,
            limit: str | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run the role's config tasks for ``hosts`` of ``inventory`` plus ``overlay`` host vars."""
    out = tmp / "out"
    play = tmp / "render.yml"
    play.write_text(RENDER_PLAY.format(hosts=hosts, venv=Path(sys.prefix), out=out))
    # host_vars files of a later inventory source override the example's host_vars files
    extra = tmp / "overlay"
    (extra / "host_vars").mkdir(parents=True, exist_ok=True)
    (extra / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "hosts": dict.fromkeys(overlay),
    }}))
    for host, host_vars in overlay.items():
        (extra / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars))
    # (the test inventory's remote temporary directory is the VM's, under its kvtest_root)
    args = ["-i", str(inventory), "-i", str(extra), "-e",
            f"ansible_remote_tmp={tmp / 'ansible-remote'}", str(play)]
    if limit:
        args[:0] = ["--limit", limit]
    return _playbook(tmp, *args), out


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "kvagent"), "-c", str(path), "config", "validate"],
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The example inventory rendered for every host; GPU host NQNs are fresh uuids."""
    tmp = tmp_path_factory.mktemp("example")
    nqns = {gpu: _uuid_nqn() for gpu in GPUS}
    result, out = _render(tmp, "kv_storage:kv_gpu",
                          {gpu: {"kvagent_hostnqn": nqn} for gpu, nqn in nqns.items()})
    assert result.returncode == 0, result.stdout + result.stderr
    return {"nqns": nqns, "out": out}


def _expected_targets(gpu: str) -> dict[str, list[dict]]:
    """What the derivation should give ``gpu``, worked out here from the inventory files.

    Per storage host whose pool lists the GPU host: the pool's ports that use the
    GPU host's most preferred transport (kvagent_initiator_transports) offered.
    """
    gpu_vars = {**_load(EXAMPLE / "group_vars/kv_gpu.yml")}
    host_file = EXAMPLE / "host_vars" / f"{gpu}.yml"
    if host_file.exists():
        gpu_vars.update(_load(host_file))
    prefs = gpu_vars["kvagent_initiator_transports"]
    expected: dict[str, list[dict]] = {}
    for storage in STORAGE:
        svars = _load(EXAMPLE / "host_vars" / f"{storage}.yml")
        ports = {p["name"]: p for p in svars["kvagent_target_ports"]}
        for pool in svars["kvagent_target_pools"]:
            if gpu not in pool["hosts"]:
                continue
            offered = [ports[name] for name in pool["ports"]]
            best = min(offered, key=lambda p: prefs.index(p["transport"])
                       if p["transport"] in prefs else len(prefs))
            expected.setdefault(pool["name"], []).append(
                {"transport": best["transport"], "address": best["address"],
                 "service": best["service"]})
    return expected


@pytest.mark.parametrize("host", STORAGE + GPUS)
def test_rendered_config_is_valid(example: dict, host: str) -> None:
    path = example["out"] / host / "kvagent.yaml"
    result = _validate(path)
    assert result.returncode == 0, result.stderr
    assert f"node {host}" in result.stdout


@pytest.mark.parametrize("gpu", GPUS)
def test_gpu_pools_are_derived_from_storage_ports(example: dict, gpu: str) -> None:
    config = _load(example["out"] / gpu / "kvagent.yaml")
    assert "target" not in config
    pools = {p["name"]: p for p in config["initiator"]["pools"]}
    expected = _expected_targets(gpu)
    assert expected, f"the example inventory gives {gpu} no pool"
    assert {name: p["targets"] for name, p in pools.items()} == expected
    settings = _load(EXAMPLE / "group_vars/kv_gpu.yml")["kvagent_initiator_pool_settings"]
    for name, pool in pools.items():
        assert pool["mount"] == f"/var/lib/kvcache/{name}"
        for key, value in settings[name].items():
            assert pool[key] == value


def test_gpu_01_draws_llama70b_from_both_storage_hosts(example: dict) -> None:
    """Two storage hosts serve one pool: one target each, RDMA where offered."""
    config = _load(example["out"] / "gpu-01" / "kvagent.yaml")
    (pool,) = config["initiator"]["pools"]
    stor1 = {p["name"]: p for p in _load(EXAMPLE / "host_vars/stor-01.yml")["kvagent_target_ports"]}
    stor2 = {p["name"]: p for p in _load(EXAMPLE / "host_vars/stor-02.yml")["kvagent_target_ports"]}
    assert [(t["transport"], t["address"]) for t in pool["targets"]] == [
        ("rdma", stor1["roce0"]["address"]), ("tcp", stor2["tcp0"]["address"])]


@pytest.mark.parametrize("storage", STORAGE)
def test_storage_pools_admit_the_gpu_hosts_by_their_nqn(example: dict, storage: str) -> None:
    config = _load(example["out"] / storage / "kvagent.yaml")
    source = _load(EXAMPLE / "host_vars" / f"{storage}.yml")
    assert "initiator" not in config
    assert config["target"]["ports"] == source["kvagent_target_ports"]
    for rendered, pool in zip(config["target"]["pools"], source["kvagent_target_pools"],
                              strict=True):
        assert rendered["hosts"] == [{"name": h, "nqn": example["nqns"][h]}
                                     for h in pool["hosts"]]
        assert {k: v for k, v in rendered.items() if k != "hosts"} == {
            k: v for k, v in pool.items() if k != "hosts"}


def test_test_inventory_renders_a_converged_host(tmp_path: Path) -> None:
    """tests/inventory.yml (the VM run): one host exports a pool and attaches it itself."""
    nqn = _uuid_nqn()
    result, out = _render(tmp_path, "kvtest", {"kvtest": {"kvagent_hostnqn": nqn}},
                          inventory=ANSIBLE / "tests" / "inventory.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    inventory = _load(ANSIBLE / "tests" / "inventory.yml")["all"]["hosts"]["kvtest"]
    path = out / "kvtest" / "kvagent.yaml"
    assert _validate(path).returncode == 0
    config = _load(path)
    (port,) = inventory["kvagent_target_ports"]
    assert config["target"]["pools"][0]["hosts"] == [{"name": "kvtest", "nqn": nqn}]
    assert config["initiator"]["pools"][0]["targets"] == [
        {"transport": port["transport"], "address": port["address"], "service": port["service"]}]
    root = _load(ANSIBLE / "tests" / "inventory.yml")["all"]["vars"]["kvtest_root"]
    assert config["node"]["state_dir"].startswith(f"{root}/")
    assert config["initiator"]["pools"][0]["mount"].startswith(f"{root}/")


def test_inconsistent_inventories_fail_with_clear_messages(tmp_path: Path) -> None:
    """Unknown GPU NQN, no common transport, and a config kvagent refuses: each host fails."""
    overlay = {
        "gpu-01": {"kvagent_hostnqn": _uuid_nqn()},
        # gpu-02's NQN is unknown: stor-01 cannot admit it
        "gpu-03": {"kvagent_hostnqn": _uuid_nqn(), "kvagent_initiator_transports": ["rdma"]},
        "stor-02": {"kvagent_health_interval": "0s"},
    }
    result, out = _render(tmp_path, "kv_storage:kv_gpu", overlay,
                          limit="stor-01,stor-02,gpu-03")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"stor-01.*the host NQN of gpu-02 is unknown", output), output
    assert re.search(r"gpu-03.*stor-02 exports pool qwen72b to this host, but none of the "
                     r"pool's ports \(tcp0\) uses a transport in kvagent_initiator_transports "
                     r"\(rdma\)", output), output
    assert re.search(r"stor-02.*health\.interval: must be at least 1s", output), output
    for host in ("stor-01", "stor-02", "gpu-03"):
        assert not (out / host / "kvagent.yaml").exists(), host


# --- the discovery referral mesh (kvagent_discovery_seeds) -------------------------------

# One NQN per GPU host for every render below: renders compare byte for byte.
MESH_NQNS = {gpu: f"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-00000000000{i}"
             for i, gpu in enumerate(GPUS, 1)}
# A third storage host that serves llama70b to gpu-01 and gpu-02 as well (its RDMA port
# without a service: the peer has none either, kvagent's default applies).
STOR_03 = {
    "kvagent_target_ports": [
        {"name": "tcp0", "id": 1, "transport": "tcp", "address": "10.0.0.13", "service": 4420},
        {"name": "roce0", "id": 2, "transport": "rdma", "address": "10.0.1.13"}],
    "kvagent_target_pools": [
        {"name": "llama70b", "backing": {"kind": "lvm", "volume_group": "vg_kv"},
         "namespaces": {"count": 2, "size": "1TiB"}, "ports": ["tcp0", "roce0"],
         "hosts": ["gpu-01", "gpu-02"]}],
}


def _fleet(tmp: Path, seeds: object) -> Path:
    """A copy of the example inventory with ``kvagent_discovery_seeds: seeds`` for all."""
    inventory = tmp / "inventory"
    subprocess.run(["cp", "-a", str(EXAMPLE), str(inventory)], check=True)
    with (inventory / "group_vars/all.yml").open("a") as f:
        f.write(yaml.safe_dump({"kvagent_discovery_seeds": seeds}))
    return inventory


def _add_storage_host(inventory: Path, host: str, host_vars: dict) -> None:
    hosts = _load(inventory / "hosts.yml")
    hosts["all"]["children"]["kv_storage"]["hosts"][host] = {"ansible_host": "10.0.0.13"}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    (inventory / "host_vars" / f"{host}.yml").write_text(yaml.safe_dump(host_vars, sort_keys=False))


def _admit(inventory: Path, storage: str, pool: str, gpu: str) -> None:
    """List ``gpu`` in ``storage``'s pool ``pool``: what admitting a host takes."""
    path = inventory / "host_vars" / f"{storage}.yml"
    host_vars = _load(path)
    (entry,) = [p for p in host_vars["kvagent_target_pools"] if p["name"] == pool]
    entry["hosts"].append(gpu)
    path.write_text(yaml.safe_dump(host_vars, sort_keys=False))


def _render_fleet(tmp: Path, inventory: Path,
                  changed: dict[str, int] | None = None) -> dict[str, bytes]:
    """Every host of ``inventory`` rendered: its kvagent.yaml's bytes per host. Into
    ``tmp``'s files as they are (a second run over a first one's): ``changed`` gets the
    play recap's changed count per host."""
    tmp.mkdir(exist_ok=True)
    result, out = _render(tmp, "kv_storage:kv_gpu",
                          {gpu: {"kvagent_hostnqn": nqn} for gpu, nqn in MESH_NQNS.items()},
                          inventory=inventory)
    assert result.returncode == 0, result.stdout + result.stderr
    if changed is not None:
        changed.update((m[1], int(m[2])) for m in re.finditer(
            r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", result.stdout, re.MULTILINE))
    rendered = {p.parent.name: p.read_bytes() for p in out.glob("*/kvagent.yaml")}
    for host in rendered:
        check = _validate(out / host / "kvagent.yaml")
        assert check.returncode == 0, (host, check.stderr)
    return rendered


def _peer(host: str, port: dict) -> dict:
    return {"name": f"{host}-{port['name']}", "transport": port["transport"],
            "address": port["address"], **({"service": port["service"]}
                                           if "service" in port else {})}


def _peers(*storage_vars: tuple[str, dict]) -> list[dict]:
    return [_peer(host, port) for host, hv in storage_vars for port in hv["kvagent_target_ports"]]


def test_mesh_mode_renders_peers_on_storage_hosts_and_seed_targets_on_gpu_hosts(
        tmp_path: Path, example: dict) -> None:
    """Seed stor-01: every storage host lists all storage ports as peers; a GPU host's
    pools are those of the default mode, each attached through the seed only, or, for
    qwen72b (not on stor-01), through the first storage host that exports it: stor-02."""
    rendered = _render_fleet(tmp_path / "mesh", _fleet(tmp_path, ["stor-01"]))
    stor = {h: _load(EXAMPLE / "host_vars" / f"{h}.yml") for h in STORAGE}
    peers = _peers(*stor.items())
    assert [p["name"] for p in peers] == ["stor-01-tcp0", "stor-01-roce0", "stor-02-tcp0"]
    for storage in STORAGE:
        config = yaml.safe_load(rendered[storage])
        assert config["target"]["peers"] == peers, storage
        # the rest as in the default mode
        default = _load(example["out"] / storage / "kvagent.yaml")
        assert list(config["target"]) == ["ports", "pools", "peers", "address_wait"]
        assert {k: v for k, v in config["target"].items() if k != "peers"} == {
            k: v for k, v in default["target"].items() if k != "pools"} | {
            "pools": [p | {"hosts": [{"name": h["name"], "nqn": MESH_NQNS[h["name"]]}
                                     for h in p["hosts"]]}
                      for p in default["target"]["pools"]]}
    roce = {"transport": "rdma", "address": "10.0.1.11", "service": 4420}  # stor-01 roce0
    expected = {"gpu-01": {"llama70b": [roce]}, "gpu-02": {"llama70b": [roce]},
                "gpu-03": {"qwen72b": [{"transport": "tcp", "address": "10.0.0.12",
                                        "service": 4420}]}}
    for gpu in GPUS:
        config = yaml.safe_load(rendered[gpu])
        assert "target" not in config
        assert {p["name"]: p["targets"] for p in config["initiator"]["pools"]} == expected[gpu]
        # everything but the targets as in the default mode (no referrals key: its
        # default, follow, is what the mesh needs)
        default = _load(example["out"] / gpu / "kvagent.yaml")
        for pool in default["initiator"]["pools"]:
            pool["targets"] = expected[gpu][pool["name"]]
        assert config == default, gpu


def test_mesh_mode_adding_a_storage_host_changes_no_gpu_hosts_config(tmp_path: Path) -> None:
    """stor-03 joins, exporting llama70b to gpu-01 and gpu-02: the storage hosts' peers
    grow by its ports, stor-03 gets the same peers, and no GPU host's config changes by a
    byte (they reach stor-03 through the seeds' referrals): the role's run after the
    change, over the first run's files, changes nothing on a GPU host."""
    inventory = _fleet(tmp_path, ["stor-01"])
    before = _render_fleet(tmp_path / "role", inventory)
    _add_storage_host(inventory, "stor-03", STOR_03)
    changed: dict[str, int] = {}
    after = _render_fleet(tmp_path / "role", inventory, changed)
    assert sorted(after) == sorted([*before, "stor-03"])
    for gpu in GPUS:
        assert after[gpu] == before[gpu], gpu
    assert {h: changed[h] for h in GPUS} == dict.fromkeys(GPUS, 0), changed
    assert all(changed[h] > 0 for h in (*STORAGE, "stor-03")), changed
    stor = [(h, _load(EXAMPLE / "host_vars" / f"{h}.yml")) for h in STORAGE]
    grown = _peers(*stor, ("stor-03", STOR_03))
    assert grown[-2:] == [
        {"name": "stor-03-tcp0", "transport": "tcp", "address": "10.0.0.13", "service": 4420},
        {"name": "stor-03-roce0", "transport": "rdma", "address": "10.0.1.13"}]
    for storage in STORAGE:
        old, new = yaml.safe_load(before[storage]), yaml.safe_load(after[storage])
        assert old["target"]["peers"] == _peers(*stor), storage
        assert new["target"]["peers"] == grown, storage
        del old["target"]["peers"], new["target"]["peers"]
        assert new == old, storage  # nothing else changed
    joined = yaml.safe_load(after["stor-03"])["target"]
    assert joined["peers"] == grown
    # it does serve the GPU hosts: their NQNs are admitted
    assert joined["pools"][0]["hosts"] == [{"name": g, "nqn": MESH_NQNS[g]}
                                           for g in ("gpu-01", "gpu-02")]


def test_mesh_mode_a_draining_storage_host_is_listed_draining_everywhere(
        tmp_path: Path) -> None:
    """kvagent_draining: true in stor-03's host vars: every storage host (itself too)
    lists its ports draining (referred to by none), nothing else of any config changes,
    and no GPU host's config changes."""
    inventory = _fleet(tmp_path, ["stor-01"])
    _add_storage_host(inventory, "stor-03", STOR_03)
    joined = _render_fleet(tmp_path / "joined", inventory)
    _add_storage_host(inventory, "stor-03", {**STOR_03, "kvagent_draining": True})
    draining = _render_fleet(tmp_path / "draining", inventory)
    assert {h for h in draining if draining[h] != joined[h]} == {*STORAGE, "stor-03"}
    for storage in (*STORAGE, "stor-03"):
        old, new = yaml.safe_load(joined[storage]), yaml.safe_load(draining[storage])
        assert [p for p in new["target"]["peers"] if p.get("draining")] == [
            {**p, "draining": True} for p in old["target"]["peers"]
            if p["name"].startswith("stor-03-")], storage
        for config in (old, new):
            for peer in config["target"]["peers"]:
                peer.pop("draining", None)
        assert new == old, storage


def test_mesh_mode_seed_exporting_the_pool_to_others_is_still_the_seed(tmp_path: Path) -> None:
    """gpu-03 is admitted to llama70b on stor-02 alone: its seed is still stor-01, which
    exports llama70b to other hosts (its discovery port refers gpu-03 on to stor-02).
    Admitting gpu-03 on stor-01 as well, an edit of stor-01's host vars alone, changes
    stor-01's config (gpu-03's NQN) and not gpu-03's."""
    inventory = _fleet(tmp_path, ["stor-01"])
    _admit(inventory, "stor-02", "llama70b", "gpu-03")
    first = _render_fleet(tmp_path / "first", inventory)
    pools = {p["name"]: p["targets"]
             for p in yaml.safe_load(first["gpu-03"])["initiator"]["pools"]}
    # gpu-03 takes NVMe/TCP only: stor-01's tcp0 port
    assert pools == {"llama70b": [{"transport": "tcp", "address": "10.0.0.11", "service": 4420}],
                     "qwen72b": [{"transport": "tcp", "address": "10.0.0.12", "service": 4420}]}
    _admit(inventory, "stor-01", "llama70b", "gpu-03")
    second = _render_fleet(tmp_path / "second", inventory)
    assert {h for h in second if second[h] != first[h]} == {"stor-01"}
    (pool,) = yaml.safe_load(second["stor-01"])["target"]["pools"]
    assert pool["hosts"][-1] == {"name": "gpu-03", "nqn": MESH_NQNS["gpu-03"]}


def test_discovery_seed_mistakes_fail_naming_the_variable_and_the_host(tmp_path: Path) -> None:
    """A seed outside the storage group, one listed twice, a string for a list, and seeds
    set on GPU hosts but not on the storage hosts (whose configs would have no peers)."""
    overlay = {
        "gpu-01": {"kvagent_hostnqn": MESH_NQNS["gpu-01"],
                   "kvagent_discovery_seeds": ["stor-09", "stor-01", "stor-01"]},
        "gpu-02": {"kvagent_hostnqn": MESH_NQNS["gpu-02"], "kvagent_discovery_seeds": "stor-01"},
        "gpu-03": {"kvagent_hostnqn": MESH_NQNS["gpu-03"], "kvagent_discovery_seeds": ["stor-02"]},
    }
    result, out = _render(tmp_path, "kv_storage:kv_gpu", overlay)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"problems on gpu-01: kvagent_discovery_seeds: stor-09 is not a host of "
                     r"group kv_storage \(kvagent_storage_group\); kvagent_discovery_seeds: "
                     r"stor-01 is listed twice; kvagent_discovery_seeds is set here but not on "
                     r"storage host stor-01, whose config would list no peers", output), output
    assert re.search(r"problems on gpu-02: kvagent_discovery_seeds must be a list of storage "
                     r"host names, not stor-01", output), output
    assert re.search(r"problems on gpu-03: kvagent_discovery_seeds is set here but not on "
                     r"storage host stor-01, [^;]*; kvagent_discovery_seeds is set here but not "
                     r"on storage host stor-02,", output), output
    for gpu in GPUS:
        assert not (out / gpu / "kvagent.yaml").exists(), gpu
    for storage in STORAGE:  # not in mesh mode themselves: rendered as ever
        assert "peers" not in _load(out / storage / "kvagent.yaml")["target"]


def test_discovery_seeds_without_storage_hosts_fail(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"kvagent_discovery_seeds": ["stor-01"]},
        "children": {"kv_storage": {"hosts": {}}, "kv_gpu": {"hosts": {"gpu-01": {}}}}}}))
    result, out = _render(tmp_path, "kv_gpu", {"gpu-01": {"kvagent_hostnqn": MESH_NQNS["gpu-01"]}},
                          inventory=inventory)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"problems on gpu-01: kvagent_discovery_seeds is set \(stor-01\) but "
                     r"group kv_storage \(kvagent_storage_group\) has no hosts", output), output
    assert not (out / "gpu-01" / "kvagent.yaml").exists()


# --- host identity --------------------------------------------------------------------

IDENTITY_PLAY = """\
- name: Ensure identities
  hosts: all
  gather_facts: false
  vars:
    kvagent_nvme_dir: {nvme}/{{{{ inventory_hostname }}}}
  tasks:
    - name: Identity
      ansible.builtin.include_role:
        name: kvagent
        tasks_from: identity.yml
    - name: Unique
      ansible.builtin.include_role:
        name: kvagent
        tasks_from: identity_unique.yml
    - name: Report
      ansible.builtin.debug:
        msg: >-
          IDENTITY {{{{ inventory_hostname }}}} {{{{ kvagent_hostnqn }}}}
          {{{{ kvagent_hostid }}}}
"""


def _identity(tmp: Path, hosts: dict) -> tuple[subprocess.CompletedProcess[str], Path]:
    nvme = tmp / "nvme"
    play = tmp / "identity.yml"
    play.write_text(IDENTITY_PLAY.format(nvme=nvme))
    inventory = tmp / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        "hosts": hosts,
    }}))
    return _playbook(tmp, "-i", str(inventory), str(play)), nvme


def _reported(output: str) -> dict[str, tuple[str, str]]:
    return {m[0]: (m[1], m[2]) for m in re.findall(r"IDENTITY (\S+) (\S+) ([^\s\"]+)", output)}


@needs_root
def test_identity_is_generated_where_missing_and_kept_where_present(tmp_path: Path) -> None:
    existing_nqn = "nqn.2014-08.org.example:host-b"  # not uuid-shaped, no trailing newline
    existing_id = str(uuid.uuid4())
    nvme = tmp_path / "nvme"
    (nvme / "b").mkdir(parents=True)
    (nvme / "b" / "hostnqn").write_text(existing_nqn)
    (nvme / "b" / "hostid").write_text(existing_id)
    pinned = _uuid_nqn()
    result, _ = _identity(tmp_path, {"a": {}, "b": {}, "c": {"kvagent_hostnqn": pinned}})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    seen = _reported(output)
    # a: generated by nvme gen-hostnqn; the host ID is the NQN's uuid
    nqn_a = (nvme / "a" / "hostnqn").read_text().strip()
    assert re.fullmatch(r"nqn\.2014-08\.org\.nvmexpress:uuid:[0-9a-f-]{36}", nqn_a)
    assert (nvme / "a" / "hostid").read_text().strip() == nqn_a.rsplit(":", 1)[1]
    assert seen["a"] == (nqn_a, nqn_a.rsplit(":", 1)[1])
    # b: existing files untouched, byte for byte
    assert (nvme / "b" / "hostnqn").read_text() == existing_nqn
    assert (nvme / "b" / "hostid").read_text() == existing_id
    assert seen["b"] == (existing_nqn, existing_id)
    # c: written from the inventory
    assert (nvme / "c" / "hostnqn").read_text() == pinned + "\n"
    assert seen["c"] == (pinned, pinned.rsplit(":", 1)[1])


@needs_root
def test_identity_differing_from_inventory_is_not_overwritten(tmp_path: Path) -> None:
    nvme = tmp_path / "nvme" / "a"
    nvme.mkdir(parents=True)
    on_disk = _uuid_nqn()
    (nvme / "hostnqn").write_text(on_disk + "\n")
    result, _ = _identity(tmp_path, {"a": {"kvagent_hostnqn": _uuid_nqn()}})
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"hostnqn on a holds {on_disk}" in output, output
    assert "kvagent_identity_overwrite" in output
    assert (nvme / "hostnqn").read_text() == on_disk + "\n"


@needs_root
def test_shared_identities_fail_naming_the_hosts(tmp_path: Path) -> None:
    """Cloned images: the pre-flight check names every host sharing an NQN or host ID."""
    cloned = _uuid_nqn()
    result, _ = _identity(tmp_path, {
        "gpu-a": {"kvagent_hostnqn": cloned},
        "gpu-b": {"kvagent_hostnqn": cloned},
        "gpu-c": {"kvagent_hostnqn": _uuid_nqn()},
    })
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"gpu-a has the same hostnqn ({cloned}) as gpu-b" in output, output
    assert f"gpu-b has the same hostnqn ({cloned}) as gpu-a" in output, output
    assert "gpu-a has the same hostid" in output
    assert "gpu-c has the same" not in output


# --- systemd files -----------------------------------------------------------------------

SERVICE_PLAY = """\
- name: Install the systemd files with the role's service tasks
  hosts: all
  gather_facts: false
  vars:
    kvagent_install_method: {method}
    kvagent_venv: /srv/kv/venv
    kvagent_config_file: /srv/kv/etc/agent.yaml
    kvagent_systemd_unit_dir: {root}/system
    kvagent_modules_load_dir: {root}/modules-load.d
    kvagent_tmpfiles_dir: {root}/tmpfiles.d
    kvagent_udev_rules_dir: {root}/udev/rules.d
    kvagent_manage_service: false
    kvagent_load_modules: false
  tasks:
    - name: Service
      ansible.builtin.import_role:
        name: kvagent
        tasks_from: service.yml
"""


@needs_root
def test_systemd_files_are_installed_for_this_venv_and_config(tmp_path: Path) -> None:
    root = tmp_path / "etc"
    play = tmp_path / "service.yml"
    play.write_text(SERVICE_PLAY.format(root=root, method="venv"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    result = _playbook(tmp_path, "-i", str(inventory), str(play))
    assert result.returncode == 0, result.stdout + result.stderr
    unit = (REPO / "systemd" / "kvagent.service").read_text()
    installed = (root / "system" / "kvagent.service").read_text()
    assert "ExecStart=/opt/kvagent/bin/kvagent run" in unit
    assert installed == unit.replace("/opt/kvagent", "/srv/kv/venv")
    assert "ExecStart=/srv/kv/venv/bin/kvagent run" in installed
    dropin = (root / "system" / "kvagent.service.d" / "kvagent-role.conf").read_text()
    assert "[Service]\nEnvironment=KVAGENT_CONFIG=/srv/kv/etc/agent.yaml\n" in dropin
    gate = (REPO / "systemd" / "kvagent-pool@.service").read_text()
    assert (root / "system" / "kvagent-pool@.service").read_text() == gate.replace(
        "/opt/kvagent", "/srv/kv/venv")
    assert "ExecStart=/srv/kv/venv/bin/kvagent wait %i" in gate.replace(
        "/opt/kvagent", "/srv/kv/venv")
    assert (root / "system" / "kvagent-pool@.service.d" / "kvagent-role.conf"
            ).read_text() == dropin
    for sub in ("modules-load.d", "tmpfiles.d"):
        assert (root / sub / "kvagent.conf").read_text() == (
            REPO / "systemd" / sub / "kvagent.conf").read_text()


@needs_root
@pytest.mark.parametrize(("version", "protect_clock_off"), [("249", True), ("252", False)])
def test_the_drop_in_turns_protect_clock_off_before_systemd_252(
        tmp_path: Path, version: str, protect_clock_off: bool) -> None:
    """Before systemd 252 the unit's ProtectClock=yes implies a device allow-list that
    refuses /dev/nvme-fabrics and block devices: the role's drop-in turns it off there."""
    root = tmp_path / "etc"
    play = tmp_path / "service.yml"
    play.write_text(SERVICE_PLAY.format(root=root, method="deb"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "kvagent_systemd_version": version}}}}))
    result = _playbook(tmp_path, "-i", str(inventory), str(play))
    assert result.returncode == 0, result.stdout + result.stderr
    for unit in ("kvagent.service.d", "kvagent-pool@.service.d"):
        dropin = (root / "system" / unit / "kvagent-role.conf").read_text()
        assert ("\nProtectClock=no\n" in dropin) is protect_clock_off, dropin
        assert "Environment=KVAGENT_CONFIG=/srv/kv/etc/agent.yaml\n" in dropin


@needs_root
def test_deb_method_installs_only_the_drop_in(tmp_path: Path) -> None:
    """The package brings the unit, modules-load.d and tmpfiles.d files: the role adds none."""
    root = tmp_path / "etc"
    play = tmp_path / "service.yml"
    play.write_text(SERVICE_PLAY.format(root=root, method="deb"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    result = _playbook(tmp_path, "-i", str(inventory), str(play))
    assert result.returncode == 0, result.stdout + result.stderr
    installed = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert installed == ["system/kvagent-pool@.service.d/kvagent-role.conf",
                         "system/kvagent.service.d/kvagent-role.conf"]


@needs_root
def test_gpu_hosts_get_nvme_clis_autoconnect_rule_masked_and_storage_hosts_do_not(
        tmp_path: Path) -> None:
    """kvagent_mask_nvme_autoconnect (default: kv_gpu hosts): the rule links to /dev/null,
    the second run changes nothing (docs/operations.md, "nvme-cli's autoconnect rule")."""
    root = tmp_path / "etc"
    play = tmp_path / "service.yml"
    play.write_text(SERVICE_PLAY.format(root=root, method="deb"))
    inventory = tmp_path / "hosts.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(yaml.safe_dump({"all": {"children": {
        "kv_gpu": {"hosts": {"gpu": local}}, "kv_storage": {"hosts": {"stor": local}}}}}))
    rule = root / "udev/rules.d/70-nvmf-autoconnect.rules"
    for run, changed in ((1, True), (2, False)):
        result = _playbook(tmp_path, "-i", str(inventory), "--limit", "gpu", str(play))
        assert result.returncode == 0, result.stdout + result.stderr
        assert rule.is_symlink() and os.readlink(rule) == "/dev/null"
        assert (re.search(r"gpu\s*:.*changed=0", result.stdout) is None) == changed, (
            run, result.stdout[-1500:])
    rule.unlink()
    result = _playbook(tmp_path, "-i", str(inventory), "--limit", "stor", str(play))
    assert result.returncode == 0, result.stdout + result.stderr
    assert not rule.exists() and not rule.is_symlink()


METHOD_PLAY = """\
- name: Show what the role runs
  hosts: all
  gather_facts: false
  vars:
    kvagent_venv: /srv/kv/venv
  tasks:
    - name: Load the role's variables
      ansible.builtin.include_role:
        name: kvagent
        tasks_from: platform.yml
        public: true
    - name: Report
      ansible.builtin.debug:
        msg: "BIN {{ __kvagent_bin }} ARGV {{ __kvagent_apply_argv | join(' ') }}
          PACKAGES {{ kvagent_system_packages | join(',') }}"
"""


@pytest.mark.parametrize(("method", "binary", "venv_package"), [
    ("deb", "/usr/bin/kvagent", False),
    ("venv", "/srv/kv/venv/bin/kvagent", True),
])
def test_install_method_picks_the_kvagent_command(tmp_path: Path, method: str, binary: str,
                                                  venv_package: bool) -> None:
    play = tmp_path / "method.yml"
    play.write_text(METHOD_PLAY)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "kvagent_install_method": method}}}}))
    result = _playbook(tmp_path, "-i", str(inventory), str(play))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"BIN {binary} ARGV {binary} -c /etc/kvagent/kvagent.yaml -o json apply --wait" \
        in result.stdout, result.stdout
    assert ("python3-venv" in result.stdout.split("PACKAGES ", 1)[1].split()[0]) is venv_package


def test_unknown_install_method_fails_naming_it(tmp_path: Path) -> None:
    play = tmp_path / "main.yml"
    play.write_text("- name: Role\n  hosts: all\n  gather_facts: false\n  roles: [kvagent]\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "kvagent_install_method": "rpm", "__kvagent_preflight_done": True}}}}))
    result = _playbook(tmp_path, "-i", str(inventory), str(play))
    assert result.returncode != 0
    assert "kvagent_install_method must be deb or venv, not rpm" in result.stdout, result.stdout


# --- the venv install method, for real (the kernel tier covers the deb method) ---------

VENV_PLAY = """\
- name: Install kvagent into a virtualenv with the role's install tasks
  hosts: all
  gather_facts: false
  vars:
    kvagent_install_method: venv
    kvagent_venv: {root}/venv
    kvagent_stage_dir: {root}/stage
    kvagent_pip_extra_args: --no-index --find-links {wheelhouse} --no-cache-dir
  tasks:
    - name: Install
      ansible.builtin.include_role:
        name: kvagent
        tasks_from: install.yml
"""


def test_venv_method_installs_kvagent_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    """Offline, from the wheelhouse scripts/setup builds: a working kvagent in a new venv."""
    wheelhouse = REPO / ".venv" / "wheelhouse"
    assert (wheelhouse / ".complete").exists(), "no wheelhouse: run scripts/setup"
    root = tmp_path / "kv"
    play = tmp_path / "venv.yml"
    play.write_text(VENV_PLAY.format(root=root, wheelhouse=wheelhouse))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"h": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "kvagent_python": "/usr/bin/python3"}}}}))

    def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr
        m = re.search(r"h\s*:\s*ok=(\d+)\s+changed=(\d+)", result.stdout)
        assert m, result.stdout
        return {"ok": int(m.group(1)), "changed": int(m.group(2))}

    first = recap(_playbook(tmp_path, "-i", str(inventory), str(play)))
    assert first["changed"] > 0
    version = subprocess.run([str(root / "venv/bin/kvagent"), "--version"],
                             capture_output=True, text=True, timeout=60, check=True)
    from agent import __version__
    assert version.stdout.strip() == f"kvagent, version {__version__}"
    second = recap(_playbook(tmp_path, "-i", str(inventory), str(play)))
    assert second["changed"] == 0, second


# --- the source packer ----------------------------------------------------------------


def _pack(source: Path, out: Path, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROLE / "files" / "pack_source.py"), str(source),
                           str(out), *paths], capture_output=True, text=True, check=False)


def test_pack_source_is_reproducible_and_skips_caches(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "agent" / "__pycache__").mkdir(parents=True)
    (src / "agent" / "sub").mkdir()
    (src / "build").mkdir()
    (src / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (src / "agent" / "__init__.py").write_text("")
    (src / "agent" / "sub" / "mod.py").write_text("A = 1\n")
    (src / "agent" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (src / "agent" / ".hidden").write_text("x")
    assert _pack(src, tmp_path / "one.tar", "pyproject.toml", "agent").returncode == 0
    # new cache files, newer mtimes: same bytes
    (src / "agent" / "sub" / "__pycache__").mkdir()
    (src / "agent" / "sub" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\1")
    os.utime(src / "agent" / "sub" / "mod.py", (2_000_000_000, 2_000_000_000))
    assert _pack(src, tmp_path / "two.tar", "pyproject.toml", "agent").returncode == 0
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    with tarfile.open(tmp_path / "one.tar") as tar:
        assert tar.getnames() == ["pyproject.toml", "agent", "agent/__init__.py", "agent/sub",
                                  "agent/sub/mod.py"]
        assert {(m.uid, m.gid) for m in tar.getmembers()} == {(0, 0)}
    # a changed source: different bytes
    (src / "agent" / "sub" / "mod.py").write_text("A = 2\n")
    assert _pack(src, tmp_path / "three.tar", "pyproject.toml", "agent").returncode == 0
    assert (tmp_path / "three.tar").read_bytes() != (tmp_path / "one.tar").read_bytes()


def test_pack_source_refuses_missing_paths(tmp_path: Path) -> None:
    result = _pack(tmp_path, tmp_path / "x.tar", "pyproject.toml")
    assert result.returncode == 2
    assert "pyproject.toml" in result.stderr
    assert not (tmp_path / "x.tar").exists()


# --- DH-HMAC-CHAP secrets ---------------------------------------------------------------

SECRETS_PLAY = """\
- name: Write secrets
  hosts: all
  gather_facts: false
  tasks:
    - name: Secrets
      ansible.builtin.include_role:
        name: kvagent
        tasks_from: secrets.yml
"""


@needs_root
def test_secrets_are_written_0600_never_logged_and_idempotent(tmp_path: Path) -> None:
    from agent.dhchap import generate, read_secret

    vaulted, on_controller = generate().text, generate().text
    src = tmp_path / "controller-gpu-2.key"
    src.write_text(on_controller + "\n")
    keys = tmp_path / "etc/keys"
    play = tmp_path / "secrets.yml"
    play.write_text(SECRETS_PLAY)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "kvagent_secrets": [{"path": str(keys / "gpu-1.key"), "content": vaulted},
                                     {"path": str(keys / "gpu-2.key"), "src": str(src)}]},
        "hosts": {"stor": {}},
    }}))
    runs = [_playbook(tmp_path, "-v", "-i", str(inventory), str(play)) for _ in range(2)]
    for run in runs:
        output = run.stdout + run.stderr
        assert run.returncode == 0, output
        assert vaulted not in output and on_controller not in output
    assert re.search(r"changed=2\b", runs[0].stdout) and re.search(r"changed=0\b", runs[1].stdout)
    assert read_secret(str(keys / "gpu-1.key")).text == vaulted  # also checks mode and owner
    assert read_secret(str(keys / "gpu-2.key")).text == on_controller
    assert oct(keys.stat().st_mode & 0o777) == "0o700"


# --- the rolling upgrade (ansible/upgrade.yml) -------------------------------------------


def _upgrade_play() -> dict:
    """upgrade.yml's play that runs the role (the other is the pre-flight)."""
    plays = yaml.safe_load((ANSIBLE / "upgrade.yml").read_text())
    (play,) = [p for p in plays if p.get("roles")]
    return play


def test_upgrade_play_goes_one_host_at_a_time_and_stops_at_a_failure() -> None:
    plays = yaml.safe_load((ANSIBLE / "upgrade.yml").read_text())
    site = yaml.safe_load((ANSIBLE / "site.yml").read_text())
    # The same pre-flight as site.yml: every identity known before the first batch.
    assert plays[0]["tasks"] == site[0]["tasks"]
    assert plays[0]["hosts"] == site[0]["hosts"] and plays[0]["any_errors_fatal"] is True
    play = _upgrade_play()
    assert play["hosts"] == site[1]["hosts"]
    assert play["serial"] == "{{ kvagent_upgrade_serial | default(1) }}"
    assert play["max_fail_percentage"] == 0
    assert play["roles"] == [{"role": "kvagent"}]
    assert [t["ansible.builtin.include_role"] for t in play["post_tasks"]] == [
        {"name": "kvagent", "tasks_from": "ready.yml"}]


class _Readyz(http.server.ThreadingHTTPServer):
    """A stand-in for kvagent's health endpoint on loopback: /readyz answers ``answers``
    in turn (the last one for good); ``asked`` counts the requests."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ReadyzHandler)
        self.answers = [(200, "ready: 1 pool(s) ready\n")]
        self.asked = 0


class _ReadyzHandler(http.server.BaseHTTPRequestHandler):
    server: _Readyz

    def do_GET(self) -> None:
        code, body = self.server.answers[min(self.server.asked, len(self.server.answers) - 1)]
        self.server.asked += 1
        data = body.encode()
        self.send_response(code if self.path == "/readyz" else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def readyz() -> Iterator[list[_Readyz]]:
    """Three stand-in health endpoints, one per host of the rollout below."""
    servers = [_Readyz() for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _rollout(tmp: Path, servers: list[_Readyz],
             *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """upgrade.yml's upgrade play as written (serial, max_fail_percentage, the gate), the
    role replaced by a task that records the host's turn, against three local hosts
    whose kvagent_health_listen are the stand-in endpoints; the hosts in turn order."""
    turns = tmp / "turns"
    play = {**_upgrade_play()}
    del play["roles"]
    play["tasks"] = [{"name": "Record this host's turn", "ansible.builtin.lineinfile": {
        "path": str(turns), "line": "{{ inventory_hostname }}", "create": True,
        "mode": "0644"}}]
    (tmp / "upgrade.yml").write_text(yaml.safe_dump([play], sort_keys=False))
    hosts = {f"h{i}": {"kvagent_health_listen": f"127.0.0.1:{s.server_address[1]}"}
             for i, s in enumerate(servers, 1)}
    inventory = tmp / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "ansible_become": False, "kvagent_ready_retries": 2,
                 "kvagent_ready_delay": 0},
        "children": {"kv_storage": {"hosts": {h: hosts[h] for h in ("h1", "h2")}},
                     "kv_gpu": {"hosts": {"h3": hosts["h3"]}}},
    }}))
    result = _playbook(tmp, "-i", str(inventory), *args, str(tmp / "upgrade.yml"))
    return result, turns.read_text().split() if turns.exists() else []


def test_rollout_waits_for_each_hosts_readyz_in_turn(tmp_path: Path,
                                                     readyz: list[_Readyz]) -> None:
    # h2 is not ready at first: its gate asks again, and h3 waits for it.
    readyz[1].answers = [(503, "not ready: 1 of 1 pool(s) not ready\n"),
                         (200, "ready: 1 pool(s) ready\n")]
    result, turns = _rollout(tmp_path, readyz)
    assert result.returncode == 0, result.stdout + result.stderr
    assert turns == ["h1", "h2", "h3"]
    assert [s.asked for s in readyz] == [1, 2, 1]
    # one host per batch: a play section per host
    assert result.stdout.count("PLAY [Upgrade kvagent one host at a time") == 3, result.stdout


@pytest.mark.parametrize("serial", [1, 2])
def test_rollout_stops_at_a_host_that_does_not_become_ready(
        tmp_path: Path, readyz: list[_Readyz], serial: int) -> None:
    """h2 never becomes ready: the rollout stops there, h3 untouched, also when h2 shares
    its batch with h1 (kvagent_upgrade_serial=2: max_fail_percentage 0 stops the play)."""
    readyz[1].answers = [(503, "not ready: 1 of 1 pool(s) not ready\n"
                               "initiator pool kv: no live controller\n")]
    result, turns = _rollout(tmp_path, readyz, "-e", f"kvagent_upgrade_serial={serial}")
    assert result.returncode != 0, result.stdout
    assert sorted(turns) == ["h1", "h2"]  # h3 untouched
    assert [s.asked for s in readyz] == [1, 3, 0]  # the first try and kvagent_ready_retries
    assert "initiator pool kv: no live controller" in result.stdout, result.stdout
