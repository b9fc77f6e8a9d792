"""The Debian package (scripts/build-deb) installed in the VM and used for real.

``apt-get install ./kvagent_<version>_all.deb`` offline: its dependencies are Debian's
python3-* packages that scripts/setup installed on the host's root filesystem, which
the guest sees. virtme-ng gives the guest copy-on-write overlays on /usr, /etc and
/var, so the install changes nothing on the host.

1. The fresh install is inert: nothing enabled or running, the unit verifies, the
   packaged default config validates and apply changes nothing; the man page and the
   bash completion (generated with Debian's click) work.
2. The lab's flow with the packaged /usr/bin/kvagent (Debian's Python and libraries):
   an LVM pool on an emulated drive exported over NVMe/TCP, attached, mounted,
   status healthy; ``kvagent run`` serves /metrics with every metric name the alert
   rules and the dashboard use; then ``apt-get remove`` and ``purge`` leave the export,
   the connection, the mount and the data alone.
3. Beside nvmetcli (Debian sid's package, its dependencies Debian 12's, fetched by
   scripts/fetch-nvmetcli), installed in either order: dpkg takes both (kvagent's
   modules are private to its package, nvmetcli owns the shared ``nvmet`` module) and
   both work: kvagent exports a pool, ``target export`` writes nvmetcli's format,
   ``nvmetcli ls``/``save`` read the tree, ``nvmetcli clear`` + ``restore`` of
   kvagent's export rebuild it as it was, and kvagent finds it converged.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent import __version__
from agent.naming import subsystem_nqn
from tests import metricnames

from . import kit
from .pools import DRIVES, KVAGENT, fabrics_controllers, umount_all_under, write_file
from .test_daemon import free_port, get

pytestmark = pytest.mark.kernel(group="lifecycle", weight=3.5)

REPO = Path(__file__).resolve().parents[2]
DEB = REPO / "build" / "deb" / f"kvagent_{__version__}_all.deb"
BIN = "/usr/bin/kvagent"
#: Where the package keeps kvagent's modules (debian/rules, debian/kvagent-launcher).
MODULES = "/usr/share/kvagent"
NVMETCLI_DEBS = REPO / "build" / "nvmetcli"
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
UNIT = Path("/lib/systemd/system/kvagent.service")
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
#: The VM has no network and apt has no package lists (virtme-ng's empty tmpfs on
#: /var/lib/apt): apt can only use the packages dpkg has installed and the .deb itself.
#: (Not --no-download: apt 2.6 then fails on a local .deb, "Pathname to install is
#: not absolute".)
APT_OFFLINE = ["-y", "-q"]


def ci_log(line: str) -> None:
    print(f"KVAGENT-CI-LOG: package: {line}")


def apt_get(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["apt-get", *APT_OFFLINE, *args], capture_output=True, text=True,
                          timeout=600, check=False, env=APT_ENV)
    assert proc.returncode == 0, f"apt-get {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def packaged(*args: str, check: bool = True, timeout: float = 600
             ) -> subprocess.CompletedProcess[str]:
    """The packaged kvagent, with a clean environment (no venv on PATH, no PYTHONPATH)."""
    proc = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, env=CLEAN_ENV, cwd="/")
    if check:
        assert proc.returncode == 0, f"kvagent {' '.join(args)} exited {proc.returncode}:\n" \
            f"{proc.stdout}\n{proc.stderr}"
    return proc


def install() -> float:
    """Install the .deb offline; returns the seconds apt-get took."""
    assert DEB.exists(), f"{DEB} is missing: run scripts/setup (it runs scripts/build-deb)"
    probe = Path("/usr/.kvagent-write-probe")
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        pytest.fail(f"/usr is not writable in the guest ({exc}): the install needs "
                    "virtme-ng's overlay on /usr")
    kit.prepare_apt()
    started = time.monotonic()
    apt_get("install", str(DEB))
    return time.monotonic() - started


@pytest.fixture(scope="module")
def package():
    """The package installed once for the module, after nvmetcli's (the order in which
    the shared ``nvmet`` module made dpkg refuse kvagent's); both purged afterwards if
    still there."""
    kit.prepare_apt()
    started = time.monotonic()
    apt_get("install", *nvmetcli_debs())
    ci_log(f"apt-get install ./nvmetcli_*.deb and its dependencies (offline) took "
           f"{time.monotonic() - started:.1f}s")
    seconds = install()
    ci_log(f"apt-get install ./{DEB.name} (offline) took {seconds:.1f}s")
    yield
    for name in ("kvagent", "nvmetcli"):
        if installed(name):
            apt_get("purge", name)


def nvmetcli_debs() -> list[str]:
    """nvmetcli's .deb and the Debian 12 packages it needs (scripts/fetch-nvmetcli)."""
    debs = sorted(str(p) for p in NVMETCLI_DEBS.glob("*.deb"))
    assert (NVMETCLI_DEBS / ".complete").exists() and any("/nvmetcli_" in d for d in debs), \
        f"{NVMETCLI_DEBS} is missing: run scripts/setup (it runs scripts/fetch-nvmetcli)"
    return debs


def installed(package: str) -> bool:
    return subprocess.run(["dpkg", "-s", package], capture_output=True,
                          check=False).returncode == 0


def data_path() -> dict[str, object]:
    """What must survive the package's removal: nvmet tree, controllers, pool mounts."""
    mounts = [line.split()[:3] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.startswith("/dev/nvme")]
    states = {c: kit.read(f"/sys/class/nvme/{c}/state") for c in fabrics_controllers()}
    return {"nvmet": kit.nvmet_tree(), "controllers": states, "mounts": mounts}


# --------------------------------------------------------------------------------------


def test_install_is_offline_inert_and_complete(package: None) -> None:
    status = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "kvagent"],
                            capture_output=True, text=True, check=True).stdout
    assert status == f"install ok installed {__version__}"
    assert packaged("--version").stdout.strip() == f"kvagent, version {__version__}"

    # Debian's interpreter and libraries, not the test venv's; kvagent's own modules from
    # the package's private directory, which the launcher puts first on the path.
    assert Path(BIN).read_text().splitlines()[0] == "#!/usr/bin/python3"
    probe = subprocess.run(
        ["/usr/bin/python3", "-c",
         f"import sys; sys.path.insert(0, {MODULES!r});"
         "import agent, nvmet, click, structlog, prometheus_client, tenacity, yaml, pyudev;"
         "from importlib.metadata import version as v;"
         "print(agent.__file__); print(nvmet.__file__);"
         "print(' '.join(f'{p} {v(p)}' for p in ('click', 'structlog', 'prometheus-client',"
         " 'tenacity', 'PyYAML', 'pyudev')))"],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    where, nvmet_where, versions = probe.stdout.splitlines()
    assert (where, nvmet_where) == (f"{MODULES}/agent/__init__.py",
                                    f"{MODULES}/nvmet/__init__.py")
    ci_log(f"packaged kvagent runs on Debian's {versions}")
    # Nothing in Python's shared module path, where other packages' modules live.
    files = subprocess.run(["dpkg", "-L", "kvagent"], capture_output=True, text=True,
                           check=True).stdout.split()
    shared = [f for f in files if f.startswith(("/usr/lib/python3", "/usr/local/lib/python3"))]
    assert not shared, shared

    # The unit: installed, verifies cleanly, not enabled, nothing running.
    verify = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True,
                            text=True, timeout=120, check=False,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMD_PAGER": ""})
    assert verify.returncode == 0 and verify.stderr == "" and verify.stdout == "", \
        verify.stderr
    assert f"ExecStart={BIN} run" in UNIT.read_text()
    assert not list(Path("/etc/systemd/system").rglob("kvagent.service")), \
        "the package enabled kvagent.service"
    running = subprocess.run(["pgrep", "-f", f"{BIN} run"], capture_output=True, check=False)
    assert running.returncode == 1, "a kvagent agent runs after the install"
    assert Path("/usr/lib/modules-load.d/kvagent.conf").exists()
    # tmpfiles.d applied by the postinst: the state directory is root's only.
    assert (os.stat("/var/lib/kvagent").st_mode & 0o777) == 0o700
    assert Path("/run/kvagent").is_dir()

    # The default config: valid, manages nothing, apply changes nothing.
    before = (kit.nvmet_tree() if kit.NVMET.exists() else [], fabrics_controllers(),
              Path("/proc/self/mounts").read_text())
    assert "valid" in packaged("config", "validate").stdout
    plan = json.loads(packaged("-o", "json", "plan").stdout)
    assert plan["actions"] == [] and not plan["changed"], plan
    applied = json.loads(packaged("-o", "json", "apply").stdout)
    assert applied["ok"] and not applied["changed"], applied
    status = packaged("-o", "json", "status", "--no-drives")
    assert json.loads(status.stdout)["pools"] == []
    after = (kit.nvmet_tree() if kit.NVMET.exists() else [], fabrics_controllers(),
             Path("/proc/self/mounts").read_text())
    assert after == before

    # Man page and completion, as installed.
    man = subprocess.run(["man", "-w", "kvagent"], capture_output=True, text=True, check=False)
    assert man.stdout.strip() == "/usr/share/man/man8/kvagent.8.gz", man.stderr
    bash = subprocess.run(
        ["bash", "--norc", "-c",
         "source /usr/share/bash-completion/completions/kvagent; "
         "COMP_WORDS=(kvagent po); COMP_CWORD=1; _kvagent_completion kvagent; "
         'printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    assert bash.stdout.split() == ["pool"], bash.stdout + bash.stderr
    for path in ("/usr/share/zsh/vendor-completions/_kvagent",
                 "/usr/share/fish/vendor_completions.d/kvagent.fish",
                 "/usr/share/kvagent/monitoring/kvagent.rules.yml",
                 "/usr/share/kvagent/monitoring/grafana/kvagent.json"):
        assert Path(path).stat().st_size > 0, path


def nvmetcli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed nvmetcli (Debian's python3, its own nvmet module), clean environment;
    ``home``: a writable HOME (configshell keeps its preferences there)."""
    home.mkdir(exist_ok=True)
    proc = subprocess.run(["nvmetcli", *args], capture_output=True, text=True, timeout=300,
                          check=False, env={**CLEAN_ENV, "HOME": str(home)}, cwd="/")
    assert proc.returncode == 0, f"nvmetcli {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def both_work(root: Path) -> None:
    """kvagent exports a whole-drive pool; nvmetcli lists and saves it, clears it and
    restores kvagent's ``target export``; kvagent then finds the tree converged. (Not a
    file pool on tmpfs: nvmetcli neither saves nor restores ``buffered_io``, which
    tmpfs needs; docs/operations.md says so.)"""
    hostnqn = kit.local_hostnqn()
    root.mkdir()
    config, home = root / "kvagent.yaml", root / "home"
    config.write_text(f"""
version: 1
node: {{name: nc, state_dir: {root}/state, run_dir: {root}/run}}
target:
  ports: [{{name: lo, id: 9, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: device, devices: [{{path: {DRIVES[1]}, host: nc}}]}}
      ports: [lo]
      hosts: [{{name: nc, nqn: "{hostnqn}"}}]
""")
    nqn = subsystem_nqn("nqn.2026-11.io.kvagent", "nc", "kv", "nc")
    try:
        applied = json.loads(packaged("-c", str(config), "-o", "json", "apply").stdout)
        assert applied["ok"] and applied["changed"], applied
        exported = root / "config.json"
        packaged("-c", str(config), "target", "export", "-f", str(exported))
        assert nqn in nvmetcli(home, "ls").stdout
        saved = root / "saved.json"
        nvmetcli(home, "save", str(saved))
        ours, theirs = json.loads(exported.read_text()), json.loads(saved.read_text())
        for key, name in (("subsystems", "nqn"), ("hosts", "nqn"), ("ports", "portid")):
            assert sorted(x[name] for x in ours[key]) == sorted(x[name] for x in theirs[key])
        before = kit.nvmet_tree()
        nvmetcli(home, "clear")
        assert kit.nvmet_is_empty()
        nvmetcli(home, "restore", str(exported))
        assert kit.nvmet_tree() == before
        plan = json.loads(packaged("-c", str(config), "-o", "json", "plan").stdout)
        assert plan["actions"] == [] and not plan["changed"], plan
        status = packaged("-c", str(config), "-o", "json", "status", "--no-drives")
        assert json.loads(status.stdout)["pools"], status.stdout
    finally:
        subprocess.run(["nvmetcli", "clear"], capture_output=True, timeout=300, check=False,
                       env={**CLEAN_ENV, "HOME": str(home)})


def test_beside_nvmetcli_in_either_order_both_work(package: None, tmp_path: Path) -> None:
    """nvmetcli was installed first (the fixture): both work. Then nvmetcli again with
    kvagent there: both still run."""
    both_work(tmp_path / "nvmetcli-first")
    owner = subprocess.run(["dpkg", "-S", "/usr/lib/python3/dist-packages/nvmet/__init__.py"],
                           capture_output=True, text=True, check=True).stdout
    assert owner.split(":")[0] == "nvmetcli", owner

    started = time.monotonic()
    apt_get("purge", "nvmetcli")
    apt_get("install", *nvmetcli_debs())
    again = time.monotonic() - started
    home = tmp_path / "home"
    assert "subsystems" in nvmetcli(home, "ls").stdout
    assert packaged("--version").stdout.strip() == f"kvagent, version {__version__}"
    assert json.loads(packaged("-o", "json", "status", "--no-drives").stdout)["pools"] == []
    versions = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}, ",
                               "kvagent", "nvmetcli", "python3-configshell-fb"],
                              capture_output=True, text=True, check=True).stdout
    ci_log(f"installed together in either order, both work: {versions.rstrip(', ')} "
           f"(nvmetcli purged and installed again beside kvagent in {again:.0f}s)")


def test_lab_flow_with_the_packaged_kvagent_then_remove_keeps_the_data_path(
        package: None, tmp_path: Path) -> None:
    hostnqn = kit.local_hostnqn()
    port = free_port()
    config = tmp_path / "kvagent.yaml"
    mount = tmp_path / "mnt" / "kv"
    textfile = tmp_path / "kvagent.prom"
    config.write_text(f"""
version: 1
node: {{name: deb, state_dir: {tmp_path}/state, run_dir: {tmp_path}/run}}
target:
  ports: [{{name: lo, id: 7, transport: tcp, address: 127.0.0.1, service: 4420}}]
  pools:
    - name: kv
      backing: {{kind: lvm, volume_group: vg_kvdeb, devices: [{DRIVES[0]}]}}
      namespaces: {{count: 1, size: 320MiB}}
      ports: [lo]
      hosts: [{{name: deb, nqn: "{hostnqn}"}}]
initiator:
  device_wait: 60s
  pools:
    - name: kv
      target: {{transport: tcp, address: 127.0.0.1}}
      mount: {mount}
      engines: [{{kind: lmcache, cleaner: {{enabled: true}}}}]  # its metrics are on the dashboard
health: {{listen: "127.0.0.1:{port}", interval: 5s, full_interval: 5s, textfile: {textfile}}}
""")
    nqn = subsystem_nqn("nqn.2026-11.io.kvagent", "deb", "kv", "deb")
    agent = None
    try:
        started = time.monotonic()
        applied = json.loads(packaged("-c", str(config), "-o", "json", "apply").stdout)
        assert applied["ok"] and applied["changed"], applied
        ci_log(f"packaged apply (carve LV, export, connect, mkfs, mount) took "
               f"{time.monotonic() - started:.1f}s")
        assert os.path.ismount(mount / "deb-ns1")
        status = packaged("-c", str(config), "-o", "json", "status", "--no-drives")
        report = json.loads(status.stdout)
        assert status.returncode == 0, status.stdout
        assert packaged("-c", str(config), "engines", "render", "kv", "--engine",
                        "lmcache").stdout.strip()
        again = json.loads(packaged("-c", str(config), "-o", "json", "apply").stdout)
        assert again["ok"] and not again["changed"], again

        # The agent from the package: /metrics carries every name rules and dashboard use.
        log = open(tmp_path / "agent.log", "w")  # noqa: SIM115
        agent = subprocess.Popen([BIN, "-c", str(config), "run"], stdout=log,
                                 stderr=subprocess.STDOUT, cwd="/",
                                 env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                      "LANG": "C.UTF-8"})
        kit.wait_for(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 240,
                     interval=1, what="the packaged agent's /readyz")
        code, text = get(f"http://127.0.0.1:{port}/metrics")
        assert code == 200
        exported = {s.name for fam in text_string_to_metric_families(text)
                    for s in fam.samples}
        absent_here: set[str] = set()
        hosts = [p for p in report["pools"] if p.get("role") == "target"]
        if hosts and all((p.get("target") or {}).get("hosts_connected") is None
                         for p in hosts):
            # nvmet on this kernel does not show connected hosts (6.1: no debugfs).
            absent_here.add("kvagent_target_hosts_connected")
        used = metricnames.exported_names_used()
        missing = sorted(used - exported - absent_here)
        assert not missing, f"/metrics of the packaged agent lacks {missing}"
        ci_log(f"/metrics of the packaged agent has {len(used - absent_here)} of the "
               f"{len(used)} names rules and dashboard use (not on this kernel/branch: "
               f"{sorted(absent_here & used)})")
        kit.wait_for(textfile.exists, 30, what="the metrics textfile")
        assert "kvagent_pool_state" in textfile.read_text()
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0
        agent = None

        # apt-get remove, then purge: the export, the connection, the mount, the data stay.
        digest = write_file(mount / "deb-ns1" / "keep.bin", 1 << 20)
        before = data_path()
        assert nqn in before["nvmet"].__str__() and before["mounts"]
        assert set(before["controllers"].values()) == {"live"}, before
        apt_get("remove", "kvagent")
        assert not Path(BIN).exists()
        assert Path("/etc/kvagent/kvagent.yaml").exists(), "remove keeps the conffile"
        assert data_path() == before
        apt_get("purge", "kvagent")
        assert not Path("/etc/kvagent/kvagent.yaml").exists()
        assert data_path() == before
        assert kit.digest_of(str(mount / "deb-ns1" / "keep.bin")) == digest
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        print((tmp_path / "agent.log").read_text()[-3000:] if (tmp_path / "agent.log").exists()
              else "")
        # Tear down with the test environment's kvagent (the package may be gone).
        config.write_text(f"version: 1\nnode: {{name: deb, state_dir: {tmp_path}/state, "
                          f"run_dir: {tmp_path}/run}}\n")
        subprocess.run([*KVAGENT, "-c", str(config), "apply"], capture_output=True,
                       timeout=600, check=False, cwd=REPO)
        subprocess.run([*KVAGENT, "-c", str(config), "pool", "destroy", "kv", "--yes"],
                       capture_output=True, timeout=600, check=False, cwd=REPO)
        umount_all_under(tmp_path)
        kit.sh("vgremove", "-f", "vg_kvdeb", check=False, timeout=120)
        kit.sh("pvremove", "-ff", "-y", DRIVES[0], check=False, timeout=120)
        kit.force_clean()
