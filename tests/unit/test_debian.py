"""debian/: the packaging agrees with the project (versions, dependencies, files).

The package itself is built by scripts/build-deb (lintian must be clean there) and
installed and used for real in tests/kernel/test_deb_package.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import requires
from pathlib import Path

from agent import __version__
from agent.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEBIAN = REPO / "debian"


def control() -> str:
    return (DEBIAN / "control").read_text()


def field(name: str) -> list[str]:
    m = re.search(rf"^{name}:\s*\n?((?:[ \t].*\n?|.*\n)(?:[ \t].*\n)*)", control(), re.M)
    assert m, name
    return [p.strip() for p in re.split(r"[,\n]", m.group(1)) if p.strip()]


def test_changelog_version_is_the_agent_s() -> None:
    version = subprocess.run(["dpkg-parsechangelog", "-l", str(DEBIAN / "changelog"), "-S",
                              "Version"], capture_output=True, text=True, check=True).stdout
    assert version.strip() == __version__, "bump debian/changelog with agent.__version__"


def runtime_requirements() -> list[str]:
    """kvagent's dependencies as this checkout's pyproject.toml states them (the installed
    metadata on Python 3.10, which has no tomllib), without the extras."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return [r for r in requires("kvagent") or [] if "extra ==" not in r]
    with (REPO / "pyproject.toml").open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


#: pyproject's dependencies by their Debian package names.
DEBIAN_NAMES = {"pyudev": "python3-pyudev", "click": "python3-click", "pyyaml": "python3-yaml",
                "tenacity": "python3-tenacity", "structlog": "python3-structlog",
                "prometheus-client": "python3-prometheus-client"}


def floors() -> dict[str, str]:
    """pyproject's dependencies and their floors, ``{"click": "8.0.4", ...}``."""
    out = {}
    for dep in runtime_requirements():
        m = re.fullmatch(r"([\w-]+)>=([\d.]+)", dep)
        assert m, f"{dep}: every dependency is NAME>=FLOOR (scripts/test-floors runs the floors)"
        out[m[1].lower()] = m[2]
    return out


def test_every_python_dependency_is_a_debian_build_dependency() -> None:
    """pyproject's dependencies, as Debian names them, are Build-Depends (the package's
    Depends come from them through dh_python3, and the build runs the CLI)."""
    names = set(floors())
    assert names == set(DEBIAN_NAMES), \
        "a new dependency needs its Debian name here and in control"
    build_depends = field("Build-Depends")
    for name in names:
        assert DEBIAN_NAMES[name] in build_depends, name


def test_the_package_depends_on_the_floors_pyproject_states() -> None:
    """Issue 35: unversioned Depends let the .deb install on Ubuntu 22.04 and crash there
    (prometheus-client 0.9.0: no Collector; structlog 20.1.0: no contextvars). Each Debian
    dependency carries pyproject's floor, the oldest release the unit tier passes against
    (scripts/test-floors)."""
    depends = field("Depends")
    for name, floor in floors().items():
        assert f"{DEBIAN_NAMES[name]} (>= {floor})" in depends, (name, floor, depends)


def test_debian_12_versions_meet_the_floors() -> None:
    """pyproject's floors are at or below what Debian 12 ships (the .deb runs on those)."""
    bookworm = {"pyudev": "0.24.0", "click": "8.1.3", "pyyaml": "6.0", "tenacity": "8.2.1",
                "structlog": "22.3.0", "prometheus-client": "0.16.0"}

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    for name, floor in floors().items():
        assert key(floor) <= key(bookworm[name]), (name, floor)


def test_the_package_depends_on_what_kvagent_runs() -> None:
    depends, recommends = field("Depends"), field("Recommends")
    assert {"${python3:Depends}", "${misc:Depends}", "nvme-cli", "kmod"} <= set(depends)
    assert {"lvm2", "xfsprogs", "fio"} <= set(recommends)


def test_rules_rewrites_what_pyproject_and_the_unit_really_say() -> None:
    """debian/rules edits pyproject's license line and the unit's ExecStart: both exist."""
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^license = "[^"]+"$', pyproject, re.M)
    unit = (REPO / "systemd" / "kvagent.service").read_text()
    assert re.search(r"^ExecStart=/opt/kvagent/bin/kvagent run$", unit, re.M)
    rules = (DEBIAN / "rules").read_text()
    assert "dh_installsystemd --no-enable" in rules, "the unit must be installed disabled"


def test_installed_files_exist() -> None:
    for line in (DEBIAN / "kvagent.install").read_text().splitlines():
        assert (REPO / line.split()[0]).exists(), line
    for name in ("kvagent.docs", "kvagent.manpages"):
        for line in (DEBIAN / name).read_text().split():
            assert (REPO / line).exists(), line
    assert (DEBIAN / "kvagent.tmpfiles").resolve() == REPO / "systemd/tmpfiles.d/kvagent.conf"
    docs = [Path(p).name for p in (DEBIAN / "kvagent.docs").read_text().split()]
    assert len(docs) == len(set(docs)), "two docs with one name overwrite each other"


def test_default_config_is_valid_and_manages_nothing() -> None:
    cfg = load_config(DEBIAN / "kvagent.yaml")
    assert cfg.target is None or not (cfg.target.pools or cfg.target.ports)
    assert cfg.initiator is None or not cfg.initiator.pools
    proc = subprocess.run([str(Path(sys.executable).parent / "kvagent"), "config", "validate",
                           str(DEBIAN / "kvagent.yaml")], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_modules_go_to_a_directory_of_the_package_s_own() -> None:
    """Issue 35: kvagent's nvmet in dist-packages collided with nvmetcli's package (dpkg
    refused either order). The modules go to the package's private directory, the one
    /usr/bin/kvagent (debian/kvagent-launcher) puts first on the module path; the real
    install beside nvmetcli is tests/kernel/test_deb_package.py's."""
    rules = (DEBIAN / "rules").read_text()
    (private,) = re.findall(r"^export PYBUILD_INSTALL_DIR = (/\S+)$", rules, re.M)
    assert not private.startswith(("/usr/lib/python3", "/usr/local")), private
    launcher = (DEBIAN / "kvagent-launcher").read_text()
    assert f'sys.path.insert(0, "{private}")' in launcher.splitlines()
    assert "debian/kvagent-launcher debian/kvagent/usr/bin/kvagent" in rules
    assert "dh_python3 $(PYBUILD_INSTALL_DIR)" in rules, "byte-compiled where it is"


def test_the_launcher_imports_kvagent_from_its_directory_first(tmp_path: Path) -> None:
    """The launcher, pointed at a scratch directory instead of /usr/share/kvagent, runs
    that directory's ``agent.cli.main.entry`` although another ``agent`` (this checkout's,
    the test environment's) is importable too."""
    private = tmp_path / "private"
    (private / "agent" / "cli").mkdir(parents=True)
    for init in ("agent/__init__.py", "agent/cli/__init__.py"):
        (private / init).write_text("")
    (private / "agent" / "cli" / "main.py").write_text(
        "def entry():\n    print(__file__)\n")
    launcher = (DEBIAN / "kvagent-launcher").read_text()
    assert launcher.count('"/usr/share/kvagent"') == 1
    copy = tmp_path / "kvagent"
    copy.write_text(launcher.replace('"/usr/share/kvagent"', repr(str(private))))
    proc = subprocess.run([sys.executable, str(copy)], capture_output=True, text=True,
                          timeout=60, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(private / "agent" / "cli" / "main.py")
