"""No secret leaves the process (issue 24): every ``kvagent`` command, in every output
format, greps clean of the secrets of the hosts it serves.

A storage host (fake nvmet configfs with Debian 13's 6.12 attributes) exports two file
pools: ``kv`` on a plain port to two hosts with DH-HMAC-CHAP (gpu0: a host secret with
transform 01 and a controller secret; gpu-2: a 64-byte transform-03 host secret and a
48-byte controller secret), and ``sec`` on a TLS port to both (the same auth, and a TLS
PSK each: SHA-256 and SHA-384). A GPU host (tests/unit/initiator/attach_fakes.py)
attaches both pools as gpu0 with the same secrets and PSK, and an lmcache engine on
``kv``. Secrets only live in files (the config names files; there is no other form);
one of each kind is rotated between the rounds, so every output format sees secret
writes on both hosts.

Every command runs through click's CliRunner with ``-vv`` (debug logs on stderr) in
each ``-o`` format; commands run through the real runner (``SubprocessRunner``, whose
log line and errors are what production shows) with ``subprocess.Popen`` answered by
the fakes, so nothing runs on this machine. Also: each command against a config that
pastes a secret where its file belongs, apply failures (a secret file with the wrong
mode, one that fails its CRC, nvmet refusing a secret write, a connect refused), the
agent (``kvagent run``: its /metrics (plain and gzip), /healthz, /readyz, the status it
serves to ``kvagent status`` on its socket and its textfile after its first pass, after
a pass that fails on a secret file and after a refused reload), the nvmet
library's own logging, and every file kvagent wrote. A secret is looked for whole, as
its base64 field, as that field's first 20 characters and as its key in hex.

What may hold a secret, on purpose: the secret files themselves, nvmet's
``dhchap_key``/``dhchap_ctrl_key`` attributes (the fake configfs and its copy on disk
that ``target show``/``export`` read), the GPU host's controller ``dhchap_secret``
attributes (the kernel's sysfs) and the file ``target export -f`` writes (0600, for
``nvmetcli restore``; docs/security.md).

The commands come from the click tree (agent/cli/main.py): a command without an entry
in :data:`CASES` fails :func:`test_every_command_has_a_case`.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import functools
import gzip
import io
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import traceback
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import nvmet
from agent import progress
from agent.cli import bench_cmd, run_cmd, status_cmd
from agent.cli.main import main
from agent.dhchap import Secret, generate, write_secret
from agent.engines import handoff
from agent.health.status import render_status_doc
from agent.initiator import reconcile as initiator_reconcile
from agent.initiator.nvme.cli import NvmeCli
from agent.initiator.nvme.kmsg import NoKernelLog
from agent.initiator.stages import tlskeys
from agent.system import keyring
from agent.system import run as run_mod
from agent.system.run import CommandResult
from agent.target import reconcile as target_reconcile
from agent.target import tls as target_tls
from agent.tlspsk import generate_psk
from nvmet.fake import KERNEL_6_12, FakeConfigFS
from tests.unit.bench.conftest import fake_fio
from tests.unit.engines.fakequota import FakeQuota
from tests.unit.fakerunner import FakeRunner
from tests.unit.initiator.attach_fakes import HOST, PREFIX, Export, FakeHost
from tests.unit.nvmet.test_target_cmd import materialize

H2 = "nqn.2014-08.org.nvmexpress:uuid:6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"
NODE = "store1"
NQN_KV = f"{PREFIX}:{NODE}:kv:gpu0"
NQN_SEC = f"{PREFIX}:{NODE}:sec:gpu0"
NQN_KV2 = f"{PREFIX}:{NODE}:kv2:gpu0"
UID, GID = os.getuid(), os.getgid()


# ------------------------------------------------------------------------ secrets
def needles(text: str) -> list[str]:
    """What must not appear for secret ``text``: the whole text, its base64 field, the
    field's first 20 characters (a truncated or wrapped copy), the key in hex."""
    b64 = text.split(":")[2]
    key = base64.b64decode(b64)[:-4]
    return [text, b64, b64[:20], key.hex()[:32]]


class Secrets:
    """Every secret the test made (old ones after a rotation too), by name."""

    def __init__(self) -> None:
        self.all: dict[str, str] = {}

    def add(self, name: str, text: str) -> str:
        self.all[f"{name}#{len(self.all)}"] = text
        return text

    def find(self, text: str) -> list[str]:
        """The secrets (by name) of which ``text`` holds any form."""
        return [name for name, s in self.all.items() if any(n in text for n in needles(s))]


# ------------------------------------------------------------------ fake commands
class FakePopen:
    """``subprocess.Popen`` for :class:`agent.system.run.SubprocessRunner`: the answer
    comes from the fake host whose command runs now (nothing is started)."""

    def __init__(self, world: World, args: tuple[str, ...], **_: Any):
        self.world, self.args, self.pid, self.returncode = world, tuple(args), 4242, None

    def communicate(self, input: str | None = None,
                    timeout: float | None = None) -> tuple[str, str]:
        if self.returncode is None:
            result = self.world.runner(self.args, check=False, input=input)
            self.returncode = result.returncode
            self.out = (result.stdout, result.stderr)
        return self.out

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        pass

    wait = poll


def keyring_insert(argv: tuple[str, ...], _stdin: str | None) -> CommandResult:
    """``nvme check-tls-key --insert``: the key appears in this host's /proc/keys."""
    opt = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    hh = int(opt["--keydata"].split(":")[1])
    ident = f"NVMe0R{hh:02d} {opt['--hostnqn']} {opt['--subsysnqn']}"
    with open(keyring.PROC_KEYS, "a") as f:
        f.write(f"1a2b3c4d I--Q---     1 perm 3b010000     0     0 psk       {ident}: 32\n")
    return CommandResult(argv, 0, "Inserted TLS key 1a2b3c4d\n", "")


# -------------------------------------------------------------------- the hosts
@dataclasses.dataclass
class Capture:
    """What one command (or endpoint, or log) showed."""

    what: str
    text: str


class World:
    """The two hosts, their configs and secrets, and everything they showed."""

    def __init__(self, root: Path, mp: pytest.MonkeyPatch):
        self.root, self.mp = root, mp
        self.secrets = Secrets()
        self.captures: list[Capture] = []
        self.ran: set[tuple[tuple[str, ...], str]] = set()  # (command path, format)
        #: host -> a config that replaces its own (the pasted-secret round)
        self.override: dict[str, Path] = {}
        #: files target export -f wrote (they hold the secrets, mode 0600)
        self.export_files: set[Path] = set()
        self.storage = root / "storage"
        self.gpu_root = root / "gpu"
        self.gpu_root.mkdir(parents=True)
        for d in ("keys", "files", "sys", "configfs", "metrics"):
            (self.storage / d).mkdir(parents=True, exist_ok=True)
        (self.gpu_root / "keys").mkdir()
        (self.gpu_root / "metrics").mkdir()
        self.fs = FakeConfigFS(check_order=True, profile=KERNEL_6_12)
        self.refuse_secret_writes = False
        self.storage_runner = FakeRunner()
        self.storage_runner.on_call(["modprobe"], self._modprobe)
        self.storage_runner.on_call(["nvme", "check-tls-key"], keyring_insert)
        self.gpu = FakeHost(self.gpu_root, exports=[Export(NQN_KV, [1]), Export(NQN_SEC, [1]),
                                                    Export(NQN_KV2, [1])])
        self.gpu.unreachable.add("10.0.0.9")
        for module in ("nvme_fabrics", "nvme_tcp"):
            (self.gpu_root / "sys/module" / module).mkdir(parents=True)
        self.gpu.runner.on_call(["nvme", "check-tls-key"], keyring_insert)
        self.gpu.runner.on(["nvme", "connect", "--transport", "tcp", "--traddr", "10.0.0.1",
                            "--trsvcid", "4420", "--nqn", NQN_KV2], returncode=1,
                           stderr="Failed to write to /dev/nvme-fabrics: Key was rejected "
                                  "by service\n")
        fio = fake_fio()
        self.gpu.runner.responses += fio.responses
        self.quota = FakeQuota()
        self.runner: FakeRunner = self.storage_runner
        self.proc_keys = {"storage": self.storage / "proc-keys", "gpu": self.gpu_root / "proc-keys"}
        for p in self.proc_keys.values():
            p.write_text("")
        self.storage_port, self.gpu_port = free_port(), free_port()
        self._make_keys()
        self.storage_config = self.storage / "kvagent.yaml"
        self.storage_config.write_text(self.storage_yaml())
        self.gpu_config = self.gpu_root / "kvagent.yaml"
        self.gpu_config.write_text(self.gpu_yaml())

    # -------------------------------------------------------------- secrets
    def _make_keys(self) -> None:
        self.keys: dict[str, tuple[Path, Path]] = {}  # name -> (storage file, gpu file)
        for name, made in (("gpu0", generate(1, 32)), ("gpu0.ctrl", generate(0, 48)),
                           ("gpu2", generate(3, 64)), ("gpu2.ctrl", generate(2, 48)),
                           ("gpu0.psk", generate_psk(1)), ("gpu2.psk", generate_psk(2))):
            self.keys[name] = (self.storage / "keys" / name, self.gpu_root / "keys" / name)
            self.write_key(name, made)

    def write_key(self, name: str, secret: Secret) -> None:
        """Both hosts' copies of secret ``name`` (a rotation when they exist)."""
        self.secrets.add(name, secret.text)
        for path in self.keys[name]:
            write_secret(str(path), secret, replace=True)

    def rotate(self, name: str) -> None:
        self.write_key(name, generate_psk(1) if name.endswith(".psk") else generate(0, 32))

    def key(self, name: str, side: int = 0) -> str:
        return str(self.keys[name][side])

    # -------------------------------------------------------------- configs
    def storage_yaml(self, *, paste: bool = False, without_sec: bool = False) -> str:
        """The storage host's config; ``paste``: gpu0's secret itself where its file
        belongs (an operator's slip)."""
        gpu0_key = (Path(self.keys["gpu0"][0]).read_text().strip() if paste
                    else self.key("gpu0"))
        gpu0_auth = (f"{{key_file: '{gpu0_key}', ctrl_key_file: {self.key('gpu0.ctrl')}, "
                     "hash: sha512, dhgroup: ffdhe4096}")
        sec = f"""
    - name: sec
      ports: [tls]
      backing: {{kind: file, directory: {self.storage}/files/sec}}
      namespaces: {{count: 1, size: 4MiB}}
      hosts:
        - {{name: gpu0, nqn: '{HOST}', auth: {gpu0_auth},
            tls: {{key_file: {self.key('gpu0.psk')}}}}}
        - {{name: gpu-2, nqn: '{H2}',
            auth: {{key_file: {self.key('gpu2')}, ctrl_key_file: {self.key('gpu2.ctrl')}}},
            tls: {{key_file: {self.key('gpu2.psk')}}}}}
"""
        return f"""version: 1
node: {{name: {NODE}, nqn_prefix: {PREFIX}, state_dir: {self.storage}/state,
        run_dir: {self.storage}/run, sysfs: {self.storage}/sys,
        configfs: {self.storage}/configfs}}
health: {{listen: "127.0.0.1:{self.storage_port}", interval: 1s, full_interval: 1s,
          textfile: {self.storage}/metrics/kvagent.prom}}
target:
  address_wait: 0s
  ports:
    - {{name: plain, id: 1, transport: tcp, address: 127.0.0.1}}
    - {{name: tls, id: 2, transport: tcp, address: 127.0.0.1, service: 4421, tls: required}}
  pools:
    - name: kv
      ports: [plain]
      backing: {{kind: file, directory: {self.storage}/files/kv}}
      namespaces: {{count: 1, size: 4MiB}}
      hosts:
        - {{name: gpu0, nqn: '{HOST}', auth: {gpu0_auth}}}
        - {{name: gpu-2, nqn: '{H2}',
            auth: {{key_file: {self.key('gpu2')}, ctrl_key_file: {self.key('gpu2.ctrl')}}}}}
{'' if without_sec else sec}"""

    def gpu_yaml(self, *, paste: bool = False) -> str:
        key = (Path(self.keys["gpu0"][1]).read_text().strip() if paste
               else self.key("gpu0", 1))
        auth = f"{{key_file: '{key}', ctrl_key_file: {self.key('gpu0.ctrl', 1)}}}"
        return self.gpu.config_text(f"""health: {{listen: "127.0.0.1:{self.gpu_port}",
          interval: 1s, full_interval: 1s, textfile: {self.gpu_root}/metrics/kvagent.prom}}
initiator:
  device_wait: 5s
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1, subsystem: '{NQN_KV}'}}
      mount: {self.gpu_root}/mnt/kv
      auth: {auth}
      engines: [{{kind: lmcache, owner: '{UID}', group: '{GID}'}}]
    - name: sec
      target: {{transport: tcp, address: 10.0.0.1, subsystem: '{NQN_SEC}'}}
      mount: {self.gpu_root}/mnt/sec
      auth: {auth}
      tls: {{key_file: {self.key('gpu0.psk', 1)}}}
""")

    # ----------------------------------------------------------------- fakes
    def _modprobe(self, argv: tuple[str, ...], _: str | None) -> CommandResult:
        (self.storage / "sys/module" / argv[-1].replace("-", "_")).mkdir(parents=True,
                                                                          exist_ok=True)
        return CommandResult(argv, 0, "", "")

    def configfs(self, _root: object = None) -> FakeConfigFS:
        return self.fs

    def use(self, host: str) -> None:
        """Commands and the keyring of ``host`` (storage or gpu) from now on."""
        self.runner = self.storage_runner if host == "storage" else self.gpu.runner
        self.mp.setattr(keyring, "PROC_KEYS", str(self.proc_keys[host]))

    def install(self) -> None:
        """Point every seam kvagent reaches at the fakes."""
        mp, world, gpu = self.mp, self, self.gpu
        fake_subprocess = types.SimpleNamespace(
            Popen=lambda args, **kw: FakePopen(world, args, **kw), PIPE=subprocess.PIPE,
            DEVNULL=subprocess.DEVNULL, TimeoutExpired=subprocess.TimeoutExpired)
        mp.setattr(run_mod, "subprocess", fake_subprocess)
        mp.setattr(nvmet, "RealConfigFS", self.configfs)
        mp.setattr(target_tls, "tlshd_running", lambda: True)
        mp.setattr(tlskeys, "tlshd_running", lambda: True)
        real_run, real_steps = target_reconcile.TargetPass.run, \
            target_reconcile.TargetPass._run_steps

        def add_devices() -> None:
            for path in (self.storage / "files").rglob("*.img"):
                self.fs.add_device(str(path), "file")

        def run(pass_: Any) -> None:
            self.fs.start_session()
            add_devices()
            real_run(pass_)

        def run_steps(pass_: Any, *args: Any) -> Any:
            out = real_steps(pass_, *args)
            add_devices()  # files made in this pass, as the kernel would open them
            return out

        mp.setattr(target_reconcile.TargetPass, "run", run)
        mp.setattr(target_reconcile.TargetPass, "_run_steps", run_steps)
        real_write = FakeConfigFS.write

        def write(fs: FakeConfigFS, path: str, value: str) -> None:
            if self.refuse_secret_writes and path.rsplit("/", 1)[-1].startswith("dhchap_"):
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            real_write(fs, path, value)

        mp.setattr(FakeConfigFS, "write", write)

        class Initiator(initiator_reconcile.InitiatorPass):
            def __init__(self, cfg: Any, runner: Any, result: Any, **kw: Any):
                kw.setdefault("sysfs", gpu.sysfs)
                kw.setdefault("cli", NvmeCli(runner, kernel_log=NoKernelLog(),
                                             fabrics_write=gpu._fabrics_write))
                kw.setdefault("seams", gpu.seams())
                super().__init__(cfg, runner, result, **kw)

        mp.setattr(initiator_reconcile, "InitiatorPass", Initiator)
        mp.setattr(os.path, "ismount", lambda p: os.fspath(p) in gpu.mounts())
        mp.setattr(bench_cmd, "is_mount", lambda p: os.fspath(p) in gpu.mounts())
        mp.setattr(handoff, "mounted_at",
                   lambda path, mountinfo=None: object() if path in gpu.mounts() else None)
        mp.setattr(handoff, "probe_mount", gpu.probe)
        mp.setattr(handoff, "XfsQuota", lambda: self.quota)
        real_hand_off = handoff.hand_off
        mp.setattr(handoff, "hand_off", functools.partial(
            real_hand_off, probe=gpu.probe, quotas=self.quota, mountinfo=gpu.mountinfo))
        from agent import daemon
        from agent.health import collect as health_collect
        real_collect = health_collect.collect

        def collect(cfg: Any, runner: Any, **kw: Any) -> Any:
            if cfg.initiator is not None:
                kw.update(mountinfo=gpu.mountinfo, quota=self.quota)
            return real_collect(cfg, runner, **kw)

        mp.setattr(health_collect, "collect", collect)  # kvagent status, imported when used
        mp.setattr(daemon, "collect", collect)

    def gpu_yaml_with_refused_pools(self) -> str:
        """The GPU host's config plus pool kv2, whose connect the target refuses (the
        kernel's answer to a wrong secret), and pool far, whose target is unreachable."""
        refused = f"""    - name: kv2
      target: {{transport: tcp, address: 10.0.0.1, subsystem: '{NQN_KV2}'}}
      mount: {self.gpu_root}/mnt/kv2
      auth: {{key_file: {self.key('gpu2', 1)}, ctrl_key_file: {self.key('gpu2.ctrl', 1)}}}
    - name: far
      target: {{transport: tcp, address: 10.0.0.9, subsystem: '{NQN_KV2}'}}
      mount: {self.gpu_root}/mnt/far
      auth: {{key_file: {self.key('gpu2', 1)}}}
      tls: {{key_file: {self.key('gpu2.psk', 1)}}}
"""
        return self.gpu_yaml() + refused

    def pasted(self, name: str) -> Path:
        """Where a config that pastes a secret goes (it holds the secret, on purpose)."""
        path = self.root / "pasted" / name
        path.parent.mkdir(exist_ok=True)
        return path

    def materialize(self) -> None:
        """The fake nvmet tree as files under node.configfs, where ``target show`` and
        ``target export`` read it (as they read the kernel's configfs)."""
        nvmet_dir = self.storage / "configfs" / "nvmet"
        if nvmet_dir.exists():
            shutil.rmtree(nvmet_dir)
        materialize(self.fs, self.storage / "configfs")

    # --------------------------------------------------------------- commands
    def config_of(self, host: str) -> Path:
        if host in self.override:
            return self.override[host]
        return self.storage_config if host == "storage" else self.gpu_config

    def cli(self, host: str, *args: str, fmt: str = "text", config: Path | None = None,
            what: str = "") -> click.testing.Result:
        """``kvagent -c CONFIG -vv -o FMT ARGS`` on ``host``; every output kept."""
        self.use(host)
        path = config or self.config_of(host)
        argv = ["-c", str(path), "-vv", "-o", fmt, *args]
        self.ran.add((command_of(list(args)), fmt))
        res = CliRunner().invoke(main, argv)
        label = (f"[{host}{' ' + what if what else ''}"
                 f"{' pasted secret' if path in self.override.values() else ''}] "
                 f"kvagent {' '.join(argv[2:])}")
        self.captures.append(Capture(f"{label} (stdout)", res.stdout))
        self.captures.append(Capture(f"{label} (stderr)", res.stderr))
        if res.exc_info is not None and res.exception is not None \
                and not isinstance(res.exception, SystemExit):
            self.captures.append(Capture(f"{label} (exception)",
                                         "".join(traceback.format_exception(*res.exc_info))))
        return res

    def ok(self, res: click.testing.Result, what: str, code: int = 0) -> click.testing.Result:
        """``res`` exited with ``code`` (not checked while a config pastes a secret: then
        every command that reads the config refuses it)."""
        if not self.override:
            assert res.exit_code == code, \
                f"{what}: exit {res.exit_code}\n{res.stdout}\n{res.stderr}"
        return res

    # ------------------------------------------------------------- the agent
    def run_agent(self, host: str, fmt: str) -> None:
        """``kvagent run`` until its first pass is served: /metrics, /healthz and /readyz
        read, and again after a pass that fails (a secret file made readable by others)
        and after a reload with a config that pastes a secret (refused: the old config
        keeps running); then the stop SIGTERM would ask for."""
        agents: list[Any] = []
        done = threading.Event()
        url = f"http://127.0.0.1:{self.storage_port if host == 'storage' else self.gpu_port}"

        class Agent(run_cmd.Agent):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kw: Any):
                super().__init__(*args, **kw)
                agents.append(self)

            def install_signals(self) -> None:  # the test process keeps its handlers
                pass

        def endpoints(when: str) -> None:
            for path in ("/metrics", "/healthz", "/readyz"):
                self.captures.append(Capture(f"[{host} run -o {fmt}] GET {path} {when}",
                                             http_get(url + path)))
            metrics = urllib.request.Request(url + "/metrics",
                                             headers={"Accept-Encoding": "gzip"})
            with urllib.request.urlopen(metrics, timeout=10) as r:
                body = gzip.decompress(r.read()).decode()
            self.captures.append(Capture(f"[{host} run -o {fmt}] GET /metrics (gzip) {when}",
                                         body))
            # kvagent status as the agent serves it on its socket (JSON, and its table)
            served = status_cmd.from_agent(agents[0].cfg, str(self.config_of(host)))
            assert served is not None and served["collected"]["source"] == "agent", when
            self.captures.append(Capture(
                f"[{host} run -o {fmt}] kvagent status from the agent {when}",
                json.dumps(served, indent=2) + "\n" + render_status_doc(served)))

        def wait(predicate: Callable[[], bool], what: str) -> None:
            deadline = time.monotonic() + 60
            while not predicate():
                if done.is_set() or time.monotonic() > deadline:
                    raise AssertionError(f"kvagent run on {host}: {what} did not happen")
                time.sleep(0.05)

        problems: list[BaseException] = []

        def drive() -> None:
            try:
                wait(lambda: bool(agents) and agents[0].store.get() is not None
                     and agents[0].server is not None, "the first pass")
                agent = agents[0]
                endpoints("after the first pass")
                # A secret file others may read: the next pass fails for its pools.
                key = Path(self.key("gpu2") if host == "storage" else self.key("gpu0", 1))
                key.chmod(0o644)
                runs = agent.counters.apply_failures
                wait(lambda: agent.counters.apply_failures > runs, "a failed pass")
                endpoints("after a failed pass")
                key.chmod(0o600)
                config = self.config_of(host)
                good = config.read_text()
                config.write_text(self.storage_yaml(paste=True) if host == "storage"
                                  else self.gpu_yaml(paste=True))
                agent.events.put("reload")
                wait(lambda: agent.counters.config_reload_failures > 0, "the refused reload")
                endpoints("after a refused reload")
                config.write_text(good)
            except BaseException as exc:
                problems.append(exc)
            finally:
                if agents:
                    agents[0]._stop_requested()

        self.mp.setattr(run_cmd, "Agent", Agent)
        self.mp.setattr(progress, "tracker", progress.Tracker())
        interval = sys.getswitchinterval()
        thread = threading.Thread(target=drive, daemon=True)
        thread.start()
        try:
            res = self.cli(host, "run", fmt=fmt)
        finally:
            done.set()
            thread.join(30)
            sys.setswitchinterval(interval)
            self.mp.setattr(progress, "tracker", progress.Tracker())
        assert not problems, problems
        assert res.exit_code == 0, res.stderr
        textfile = (self.storage if host == "storage" else self.gpu_root) / "metrics/kvagent.prom"
        self.captures.append(Capture(f"[{host} run -o {fmt}] textfile", textfile.read_text()))


def http_get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return f"{r.status}\n{r.read().decode()}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code}\n{exc.read().decode()}"


def export_formats() -> list[str]:
    """The formats ``target export --format`` offers."""
    ctx = click.Context(main)
    group = main.get_command(ctx, "target")
    assert isinstance(group, click.Group)
    export = group.get_command(ctx, "export")
    assert export is not None
    option = next(p for p in export.params if p.name == "fmt")
    assert isinstance(option.type, click.Choice)
    return list(option.type.choices)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------- the cases
def formats() -> list[str]:
    """The result formats ``-o`` offers (every case runs in each)."""
    option = next(p for p in main.params if p.name == "output")
    assert isinstance(option.type, click.Choice)
    return list(option.type.choices)


def leaf_commands() -> list[tuple[str, ...]]:
    """Every command of the click tree, as its path of names (groups walked)."""
    out: list[tuple[str, ...]] = []

    def walk(group: click.Group, ctx: click.Context, path: tuple[str, ...]) -> None:
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            assert cmd is not None
            if isinstance(cmd, click.Group):
                walk(cmd, click.Context(cmd, info_name=name, parent=ctx), (*path, name))
            else:
                out.append((*path, name))

    walk(main, click.Context(main, info_name="kvagent"), ())
    return out


def command_of(args: list[str]) -> tuple[str, ...]:
    """The command path ``args`` runs (options and their values skipped)."""
    cmd: click.Command = main
    ctx = click.Context(main, info_name="kvagent")
    path: list[str] = []
    for arg in args:
        if not isinstance(cmd, click.Group):
            break
        if arg in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, arg)
            assert sub is not None
            path.append(arg)
            ctx = click.Context(sub, info_name=arg, parent=ctx)
            cmd = sub
    return tuple(path)


def case_plan(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.cli(host, "plan", fmt=fmt)


def case_apply(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.cli(host, "apply", "--dry-run", fmt=fmt)
        w.ok(w.cli(host, "apply", fmt=fmt), f"{host} apply")


def case_status(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.cli(host, "status", fmt=fmt)
        w.cli(host, "status", "--no-drives", fmt=fmt)


def case_target_show(w: World, fmt: str) -> None:
    w.materialize()
    res = w.ok(w.cli("storage", "target", "show", fmt=fmt), "target show")
    if not w.override:
        assert "<set>" in res.stdout and HOST in res.stdout  # it did show gpu0's entry


def case_target_export(w: World, fmt: str) -> None:
    w.materialize()
    for kind in export_formats():
        # The tree holds secrets: never printed, only written to a private file.
        w.ok(w.cli("storage", "target", "export", "--format", kind, fmt=fmt),
             "target export to stdout", 2)
        out = w.root / "exports" / f"{fmt}-{kind}.json"
        out.parent.mkdir(exist_ok=True)
        w.ok(w.cli("storage", "target", "export", "--format", kind, "-f", str(out), fmt=fmt),
           "target export -f")
        w.export_files.add(out)


def case_pool_list(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.ok(w.cli(host, "pool", "list", fmt=fmt), f"{host} pool list")


def case_pool_destroy(w: World, fmt: str) -> None:
    w.cli("storage", "pool", "destroy", "sec", fmt=fmt, what="configured")  # refused
    smaller = w.storage / "without-sec.yaml"
    smaller.write_text(w.storage_yaml(without_sec=True))
    w.ok(w.cli("storage", "apply", fmt=fmt, config=smaller), "apply without pool sec")
    w.cli("storage", "pool", "destroy", "sec", fmt=fmt, config=smaller)
    w.ok(w.cli("storage", "pool", "destroy", "sec", "--yes", fmt=fmt, config=smaller),
       "pool destroy --yes")
    w.ok(w.cli("storage", "apply", fmt=fmt), "apply with pool sec again")


def case_engines_render(w: World, fmt: str) -> None:
    w.ok(w.cli("gpu", "engines", "render", "kv", "--engine", "lmcache", fmt=fmt),
       "engines render")


def case_engines_check(w: World, fmt: str) -> None:
    # The venv has no lmcache: the checker says it cannot load it (exit 1).
    w.cli("gpu", "engines", "check", "kv", "--engine", "lmcache", "--python", sys.executable,
          fmt=fmt)


def case_keys_show(w: World, fmt: str) -> None:
    files = [w.key(name) for name in w.keys]
    w.ok(w.cli("storage", "keys", "show", *files, fmt=fmt), "keys show")
    w.ok(w.cli("gpu", "keys", "show", w.key("gpu0", 1), fmt=fmt), "keys show one")
    bad = w.root / "bad" / f"{fmt}.key"
    bad.parent.mkdir(exist_ok=True)
    corrupt = broken_crc(generate(0, 32))
    w.secrets.add("corrupt", corrupt)
    bad.write_text(corrupt + "\n")
    bad.chmod(0o600)
    w.ok(w.cli("storage", "keys", "show", str(bad), fmt=fmt, what="bad CRC"), "keys show bad", 2)
    loose = w.root / "bad" / f"{fmt}-0644.key"
    write_secret(str(loose), Secret(w.secrets.add("loose", generate().text)), replace=True)
    loose.chmod(0o644)
    w.ok(w.cli("storage", "keys", "show", str(loose), fmt=fmt, what="mode 0644"),
       "keys show 0644", 2)


def case_keys_generate(w: World, fmt: str) -> None:
    made = w.root / "generated"
    made.mkdir(exist_ok=True)
    for name, extra in ((f"{fmt}.key", ()), (f"{fmt}-sha384.key", ("--hmac", "sha384",
                                                                  "--length", "48")),
                        (f"{fmt}.psk", ("--tls",)), (f"{fmt}-384.psk", ("--tls", "--hmac",
                                                                         "sha384"))):
        path = made / name
        w.ok(w.cli("storage", "keys", "generate", str(path), *extra, fmt=fmt), "keys generate")
        w.secrets.add(f"generated {name}", path.read_text().strip())
        w.cli("storage", "keys", "generate", str(path), *extra, fmt=fmt, what="exists")
        w.ok(w.cli("storage", "keys", "generate", "--replace", str(path), *extra, fmt=fmt),
           "keys generate --replace")
        w.secrets.add(f"replaced {name}", path.read_text().strip())


def case_config_validate(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.ok(w.cli(host, "config", "validate", fmt=fmt), f"{host} config validate")
    pasted = w.pasted("config-validate.yaml")
    pasted.write_text(w.storage_yaml(paste=True))
    w.cli("storage", "config", "validate", str(w.storage_config), str(w.gpu_config),
          str(pasted), fmt=fmt, what="pasted secret")


def case_bench(w: World, fmt: str) -> None:
    w.ok(w.cli("gpu", "bench", "kv", "--profile", "tiny", fmt=fmt), "bench")


def case_wait(w: World, fmt: str) -> None:
    w.cli("gpu", "wait", "kv", "--timeout", "0", fmt=fmt, what="no agent: not ready")
    w.cli("storage", "wait", "kv", fmt=fmt, what="not a GPU pool there")


def case_run(w: World, fmt: str) -> None:
    for host in ("storage", "gpu"):
        w.run_agent(host, fmt)


#: One case per command (its path in the click tree): what runs it on the fakes. The
#: order is the order they run in, every round (one round per -o format).
CASES: dict[tuple[str, ...], Callable[[World, str], None]] = {
    ("plan",): case_plan,
    ("apply",): case_apply,
    ("status",): case_status,
    ("target", "show"): case_target_show,
    ("target", "export"): case_target_export,
    ("pool", "list"): case_pool_list,
    ("engines", "render"): case_engines_render,
    ("engines", "check"): case_engines_check,
    ("keys", "show"): case_keys_show,
    ("keys", "generate"): case_keys_generate,
    ("config", "validate"): case_config_validate,
    ("bench",): case_bench,
    ("run",): case_run,
    ("wait",): case_wait,
    ("pool", "destroy"): case_pool_destroy,  # last: the next round's apply restores sec
}


def broken_crc(secret: Secret) -> str:
    """``secret`` with its CRC changed: the form of a secret that fails its check."""
    prefix, hh, b64, _ = secret.text.split(":")
    blob = bytearray(base64.b64decode(b64))
    blob[-1] ^= 0xFF
    return f"{prefix}:{hh}:{base64.b64encode(bytes(blob)).decode()}:"


def failures(w: World, fmt: str) -> None:
    """Apply and plan fail on both hosts, each way a secret can be the cause."""
    key = Path(w.key("gpu2"))
    good = key.read_text()
    key.chmod(0o644)  # a secret file others can read: refused, naming the file
    w.cli("storage", "plan", fmt=fmt, what="gpu2 key 0644")
    w.cli("storage", "apply", fmt=fmt, what="gpu2 key 0644")
    key.chmod(0o600)
    corrupt = broken_crc(generate(3, 64))
    w.secrets.add("corrupt gpu2", corrupt)
    key.write_text(corrupt + "\n")  # fails its CRC
    w.ok(w.cli("storage", "plan", fmt=fmt, what="gpu2 key bad CRC"), "plan, bad CRC", 2)
    w.ok(w.cli("storage", "apply", fmt=fmt, what="gpu2 key bad CRC"), "apply, bad CRC", 2)
    key.write_text(good)
    psk = Path(w.key("gpu2.psk"))
    good = psk.read_text()
    corrupt = broken_crc(generate_psk(2))
    w.secrets.add("corrupt psk", corrupt)
    psk.write_text(corrupt + "\n")
    w.ok(w.cli("storage", "plan", fmt=fmt, what="gpu2 PSK bad CRC"), "plan, bad PSK", 2)
    psk.write_text(good)
    w.rotate("gpu2")  # a new secret that nvmet refuses to store
    w.refuse_secret_writes = True
    try:
        w.ok(w.cli("storage", "apply", fmt=fmt, what="nvmet refuses the secret"),
           "apply, nvmet refuses", 1)
    finally:
        w.refuse_secret_writes = False
    w.ok(w.cli("storage", "apply", fmt=fmt), "apply after the refusal")
    gpu_key = Path(w.key("gpu0", 1))
    gpu_key.chmod(0o640)
    w.ok(w.cli("gpu", "apply", fmt=fmt, what="gpu0 key 0640"), "gpu apply, key 0640", 2)
    gpu_key.chmod(0o600)
    # A pool whose connect the target refuses (a wrong secret), and one unreachable.
    rejected = w.gpu_root / f"rejected-{fmt}.yaml"
    rejected.write_text(w.gpu_yaml_with_refused_pools())
    w.ok(w.cli("gpu", "apply", fmt=fmt, config=rejected, what="connect refused"),
       "gpu apply, connect refused", 1)
    w.cli("gpu", "plan", fmt=fmt, config=rejected, what="connect refused")
    # Every command with a config that holds a secret where its file belongs.
    for host in ("storage", "gpu"):
        pasted = w.pasted(f"{host}.yaml")
        pasted.write_text(w.storage_yaml(paste=True) if host == "storage"
                          else w.gpu_yaml(paste=True))
        w.override[host] = pasted
    try:
        for command, case in CASES.items():
            if command != ("run",):  # run: the agent refuses its reload (case_run)
                case(w, fmt)
    finally:
        w.override.clear()


# ---------------------------------------------------------------------- the run
@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Every case in every format (secrets rotated between the rounds), then the
    failures; the nvmet library's own logging (the standard library's) kept too."""
    from agent.log import configure_logging

    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setLevel(logging.DEBUG)
    root_logger = logging.getLogger()
    level = root_logger.level
    root_logger.addHandler(handler)
    root_logger.setLevel(logging.DEBUG)
    try:
        with pytest.MonkeyPatch.context() as mp:
            w = World(tmp_path_factory.mktemp("no-secret"), mp)
            w.install()
            for n, fmt in enumerate(formats()):
                if n:  # every round writes secrets: one of each kind is new
                    for name in ("gpu0", "gpu2.ctrl", "gpu0.psk"):
                        w.rotate(name)
                for case in CASES.values():
                    case(w, fmt)
                failures(w, fmt)
            w.captures.append(Capture("standard library logging (nvmet)", logs.getvalue()))
            yield w
    finally:
        root_logger.removeHandler(handler)
        root_logger.setLevel(level)
        configure_logging()


def test_every_command_has_a_case() -> None:
    missing = [" ".join(c) for c in leaf_commands() if c not in CASES]
    assert not missing, (
        f"kvagent {', kvagent '.join(missing)}: no case in CASES of {__name__}: add one that "
        "runs the command against the fakes (it runs in every -o format), so that no "
        "output of it can carry a secret unseen")
    stale = [" ".join(c) for c in CASES if c not in leaf_commands()]
    assert not stale, f"CASES names commands the CLI does not have: {stale}"


def test_every_command_ran_in_every_format(world: World) -> None:
    wanted = {(c, fmt) for c in leaf_commands() for fmt in formats()}
    assert not wanted - world.ran, sorted(wanted - world.ran)


def test_no_output_of_any_command_holds_a_secret(world: World) -> None:
    """stdout, stderr (logs at debug), tracebacks, the agent's endpoints and textfile,
    the standard library's log: none holds any form of any secret."""
    leaks = [(c.what, world.secrets.find(c.text), excerpt(c.text, world.secrets))
             for c in world.captures if world.secrets.find(c.text)]
    assert not leaks, "\n\n".join(f"{what}: {names}\n{text}" for what, names, text in leaks)


def test_every_command_ran_on_the_fakes(world: World) -> None:
    """No command met a program the fakes do not answer, or a kvagent bug: the outputs
    looked at are the real ones."""
    broken = [c.what for c in world.captures if c.what.endswith("(exception)") or any(
        w in c.text for w in ("unexpected command", "internal error", "unexpected error"))]
    assert not broken, broken


def allowed(world: World, path: Path) -> bool:
    """Files that hold secrets on purpose (see the module's docstring)."""
    if path in world.export_files:
        return True
    under = [world.storage / "keys", world.gpu_root / "keys", world.root / "generated",
             world.root / "bad", world.root / "pasted",
             world.storage / "configfs" / "nvmet" / "hosts"]
    if any(path.is_relative_to(d) for d in under):
        return True
    # the GPU host's kernel: the controllers' secrets (sysfs)
    return (path.is_relative_to(world.gpu_root / "sys")
            and path.name in ("dhchap_secret", "dhchap_ctrl_secret"))


def test_no_file_kvagent_wrote_holds_a_secret(world: World) -> None:
    """Records, state, engine configs, manifests, the last apply, metrics textfiles,
    the agent's answers: only the files that must hold a secret do."""
    leaks = []
    for path in sorted(world.root.rglob("*")):
        if path.is_symlink() or not path.is_file() or allowed(world, path):
            continue
        found = world.secrets.find(path.read_bytes().decode("latin-1"))
        if found:
            leaks.append(f"{path.relative_to(world.root)}: {found}")
    assert not leaks, "\n".join(leaks)


def test_the_secrets_reached_where_they_must(world: World) -> None:
    """The grep is not blind: the secrets are in nvmet, in the GPU host's kernel, in the
    connect requests written to /dev/nvme-fabrics (on the writer's standard input, never
    its command line) and in the export file (0600), in the forms looked for."""
    gpu0 = Path(world.key("gpu0")).read_text().strip()
    assert world.fs.read(f"hosts/{HOST}/dhchap_key") == gpu0
    assert gpu0 in world.secrets.all.values()
    ctrl = Path(world.key("gpu2.ctrl")).read_text().strip()
    assert world.fs.read(f"hosts/{H2}/dhchap_ctrl_key") == ctrl
    sysfs = {p.read_text().strip() for p in (world.gpu_root / "sys").rglob("dhchap_secret")}
    assert gpu0 in sysfs, "the GPU host's controllers did not get gpu0's secret"
    connects = [w for w in world.gpu.fabrics_writes if "dhchap_secret" in w]
    assert connects and all(world.secrets.find(w["dhchap_secret"]) for w in connects)
    keydata = [c for c in world.storage_runner.calls if "--keydata" in c]
    assert keydata and all(world.secrets.find(" ".join(c)) for c in keydata)
    assert world.export_files
    for path in world.export_files:
        assert world.secrets.find(path.read_text()), f"{path} holds no secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def excerpt(text: str, secrets: Secrets) -> str:
    """The lines of ``text`` that hold a secret."""
    forms = [n for s in secrets.all.values() for n in needles(s)]
    return "\n".join(line[:400] for line in text.splitlines() if any(f in line for f in forms))


# ------------------------------------------------------- the two leaks this found
def test_a_secret_pasted_where_its_file_belongs_is_never_echoed(tmp_path: Path) -> None:
    """Config problems echoed the value: a secret pasted as key_file (or inside a path)
    went to the terminal, ``config validate -o json``, the agent's log and apply's
    answer. Now each shows ``<secret>`` and says what to do."""
    secret, psk = generate(1, 32).text, generate_psk(1).text
    config = tmp_path / "kvagent.yaml"
    config.write_text(f"""version: 1
node: {{name: gpu0, state_dir: {tmp_path}/state, run_dir: {tmp_path}/run}}
initiator:
  pools:
    - name: kv
      target: {{transport: tcp, address: 10.0.0.1}}
      mount: {tmp_path}/mnt/kv
      auth: {{key_file: '{secret}'}}
      tls: {{key_file: '/etc/kvagent/{psk}'}}
""")
    for fmt in formats():
        res = CliRunner().invoke(main, ["-c", str(config), "-o", fmt, "config", "validate",
                                        str(config), str(config)])
        assert res.exit_code == 2
        for out in (res.stdout, res.stderr):
            assert not [n for s in (secret, psk) for n in needles(s) if n in out], out
        assert "auth.key_file: '<secret>' is not an absolute path" in res.stderr
        assert "tls.key_file: /etc/kvagent/<secret> does not exist" in res.stderr
        assert "that is a secret itself" in res.stderr


def test_target_export_never_prints_a_tree_with_secrets(tmp_path: Path) -> None:
    """``target export`` printed every host's dhchap_key on stdout (a shell redirect
    makes a 0644 file of it). A tree with secrets is now written only with -f (0600)."""
    from tests.unit.nvmet.test_target_cmd import CTRL_SECRET, SECRET, with_secret_host

    root = with_secret_host(tmp_path)
    res = CliRunner().invoke(main, ["target", "export", "--configfs", str(root)])
    assert res.exit_code == 2 and res.stdout == ""
    assert SECRET not in res.stderr and CTRL_SECRET not in res.stderr
    assert "never prints a secret" in res.stderr and "-f FILE" in res.stderr
    out = tmp_path / "config.json"
    res = CliRunner().invoke(main, ["target", "export", "-f", str(out), "--configfs",
                                    str(root)])
    assert res.exit_code == 0 and SECRET in out.read_text()
