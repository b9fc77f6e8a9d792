"""Config loading and validation: every example is valid; broken configs name their field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from agent.cli.main import main
from agent.config import ConfigError, load_config, parse_config

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
HOST_A = "nqn.2014-08.org.nvmexpress:uuid:2b7e1a3c-0d4f-4b6a-9c1e-5f2a7d9e0b11"
HOST_B = "nqn.2014-08.org.nvmexpress:uuid:6c3f2b4d-1e5a-4c7b-8d2f-6a3b8e0f1c22"


def base() -> dict:
    """A valid config with both roles; each broken case mutates one thing."""
    return {
        "version": 1,
        "node": {"name": "stor-01"},
        "target": {
            "ports": [{"name": "tcp0", "id": 1, "transport": "tcp", "address": "10.0.0.11"}],
            "pools": [{
                "name": "llama70b",
                "backing": {"kind": "lvm", "volume_group": "vg_nvme"},
                "namespaces": {"count": 4, "size": "512GiB"},
                "ports": ["tcp0"],
                "hosts": [{"name": "gpu-01", "nqn": HOST_A}],
            }],
        },
        "initiator": {
            "pools": [{
                "name": "llama70b",
                "target": {"transport": "tcp", "address": "10.0.0.11"},
                "mount": "/var/lib/kvcache/llama70b",
                "engines": [{"kind": "lmcache"}],
            }],
        },
        "health": {"listen": "127.0.0.1:9808"},
    }


def test_engine_cleaner_is_off_and_gds_checked_by_default() -> None:
    data = base()
    data["initiator"]["pools"][0]["engines"] = [
        {"kind": "vllm", "cpu_cache": "1GiB", "cleaner": {"enabled": True}},
        {"kind": "dynamo", "gds": "trust"}, {"kind": "lmcache"}]
    vllm, dynamo, lmcache = parse_config(yaml.safe_dump(data)).initiator.pools[0].engines
    assert (vllm.cleaner.enabled, vllm.cleaner.high, vllm.cleaner.low) == (True, 95, 85)
    assert lmcache.cleaner.enabled is False and lmcache.gds is None
    assert dynamo.gds == "trust" and not dynamo.checks_gds
    (default,) = parse_config(yaml.safe_dump({**data, "initiator": {"pools": [{
        **data["initiator"]["pools"][0], "engines": [{"kind": "dynamo"}]}]}})
    ).initiator.pools[0].engines
    assert default.gds is None and default.checks_gds, "dynamo checks GDS unless told to trust"


def test_base_is_valid() -> None:
    cfg = parse_config(yaml.safe_dump(base()))
    pool = cfg.target.pools[0]
    assert pool.namespaces.size == 512 * 1024**3
    assert cfg.initiator.pools[0].targets[0].service == 4420
    assert cfg.initiator.pools[0].connect.ctrl_loss_tmo == "forever"


def test_referrals_are_followed_unless_ignored() -> None:
    data = base()
    assert parse_config(yaml.safe_dump(data)).initiator.pools[0].referrals == "follow"
    data["initiator"]["pools"][0]["referrals"] = "ignore"
    assert parse_config(yaml.safe_dump(data)).initiator.pools[0].referrals == "ignore"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(example: Path) -> None:
    result = CliRunner().invoke(main, ["config", "validate", str(example)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output


def _set(d: dict, path: str, value: object) -> dict:
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is _DELETE:
        del node[int(last) if last.isdigit() else last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return d


_DELETE = object()
P = "target.pools.0"
INI = "initiator.pools.0"

# (case id, mutation path, new value, expected field path in the message, expected words)
BROKEN = [
    ("version-2", "version", 2, "version", "not one of"),
    ("unknown-top-key", "nodes", {"name": "x"}, "nodes", "unknown key"),
    ("typo-in-node", "node.nmae", "x", "node.nmae", "did you mean 'name'"),
    ("bad-node-name", "node.name", "Stor_01", "node.name", "not a valid name"),
    ("bad-prefix", "node.nqn_prefix", "iqn.2026-11.io.kvagent", "node.nqn_prefix", "NQN prefix"),
    ("relative-state-dir", "node.state_dir", "var/lib/kvagent", "node.state_dir", "absolute"),
    ("dotdot-path", "node.run_dir", "/run/../etc", "node.run_dir", "'..'"),
    ("port-id-zero", "target.ports.0.id", 0, "target.ports[0].id", "out of range"),
    ("port-id-string", "target.ports.0.id", "one", "target.ports[0].id", "integer"),
    ("bad-transport", "target.ports.0.transport", "fc", "target.ports[0].transport", "tcp, rdma"),
    ("bad-ipv4", "target.ports.0.address", "10.0.0.300", "target.ports[0].address", "IPv4"),
    ("hostname-not-ip", "target.ports.0.address", "stor-01.lan", "target.ports[0].address",
     "IPv6"),
    ("service-too-big", "target.ports.0.service", 70000, "target.ports[0].service", "range"),
    ("unknown-port-ref", f"{P}.ports", ["tcp9"], "target.pools[0].ports[0]", "unknown port"),
    ("bad-backing-kind", f"{P}.backing.kind", "zfs", "target.pools[0].backing.kind",
     "lvm, file, device"),
    ("missing-vg", f"{P}.backing", {"kind": "lvm"}, "target.pools[0].backing.volume_group",
     "required"),
    ("bad-size", f"{P}.namespaces.size", "512 gigs", "target.pools[0].namespaces.size",
     "not a size"),
    ("tiny-size", f"{P}.namespaces.size", "1MiB", "target.pools[0].namespaces.size",
     "too small"),
    ("ns-count-zero", f"{P}.namespaces.count", 0, "target.pools[0].namespaces.count", "range"),
    ("bad-host-nqn", f"{P}.hosts.0.nqn", "nqn.2014-08.org.nvmexpress:uuid:zzz",
     "target.pools[0].hosts[0].nqn", "malformed uuid"),
    ("nqn-with-slash", f"{P}.hosts.0.nqn", "nqn.2026-01.com.example:a/b",
     "target.pools[0].hosts[0].nqn", "'/'"),
    ("nqn-with-space", f"{P}.hosts.0.nqn", "nqn.2026-01.com.example:a b",
     "target.pools[0].hosts[0].nqn", "whitespace"),
    ("nqn-too-long", f"{P}.hosts.0.nqn", "nqn.2026-01.com.example:" + "x" * 200,
     "target.pools[0].hosts[0].nqn", "223"),
    ("nqn-bad-month", f"{P}.hosts.0.nqn", "nqn.2026-13.com.example:x",
     "target.pools[0].hosts[0].nqn", "month"),
    ("duplicate-host-name", f"{P}.hosts", [{"name": "gpu-01", "nqn": HOST_A},
                                           {"name": "gpu-01", "nqn": HOST_B}],
     "target.pools[0].hosts[1].name", "used twice"),
    ("duplicate-host-nqn", f"{P}.hosts", [{"name": "gpu-01", "nqn": HOST_A},
                                          {"name": "gpu-02", "nqn": HOST_A}],
     "target.pools[0].hosts[1].nqn", "listed twice"),
    ("allow-any-not-shared", f"{P}.allow_any_host", True, "target.pools[0].allow_any_host",
     "shared: true"),
    ("device-kind-namespaces", f"{P}.backing",
     {"kind": "device", "devices": [{"path": "/dev/disk/by-id/nvme-eui.01", "host": "gpu-01"}]},
     "target.pools[0].namespaces", "not used with kind: device"),
    ("device-not-by-id", f"{P}.backing",
     {"kind": "device", "devices": [{"path": "/dev/nvme0n1", "host": "gpu-01"}]},
     "target.pools[0].backing.devices[0].path", "by-id"),
    ("file-missing-namespaces", f"{P}.namespaces", _DELETE, "target.pools[0].namespaces",
     "required"),
    ("bool-as-string", f"{P}.shared", "yes", "target.pools[0].shared", "true or false"),
    ("duplicate-port-id", "target.ports",
     [{"name": "tcp0", "id": 1, "transport": "tcp", "address": "10.0.0.11"},
      {"name": "tcp1", "id": 1, "transport": "tcp", "address": "10.0.0.12"}],
     "target.ports[1].id", "used twice"),
    ("duplicate-pool-name", "target.pools.1", None, "target.pools[1].name", "used twice"),
    ("relative-mount", f"{INI}.mount", "kvcache", "initiator.pools[0].mount", "absolute"),
    ("bad-layout", f"{INI}.layout", "raid5", "initiator.pools[0].layout", "per-namespace"),
    ("bad-engine", f"{INI}.engines.0.kind", "tensorrt", "initiator.pools[0].engines[0].kind",
     "lmcache"),
    ("engine-capacity-over", f"{INI}.engines", [{"kind": "lmcache", "capacity": "60%"},
                                              {"kind": "vllm", "capacity": "40%"}],
     "initiator.pools[0].engines", "at most 90%"),
    ("unquoted-mode", f"{INI}.engines.0.mode", 750, "initiator.pools[0].engines[0].mode",
     "octal"),
    ("cleaner-low-above-high", f"{INI}.engines.0.cleaner", {"enabled": True, "high": "80%",
                                                           "low": "90%"},
     "initiator.pools[0].engines[0].cleaner.low", "must be below high (80%)"),
    ("cleaner-watermark-not-percent", f"{INI}.engines.0.cleaner", {"high": "lots"},
     "initiator.pools[0].engines[0].cleaner.high", "percentage"),
    ("cleaner-typo", f"{INI}.engines.0.cleaner", {"enabeld": True},
     "initiator.pools[0].engines[0].cleaner.enabeld", "did you mean 'enabled'"),
    ("cleaner-without-quotas", f"{INI}", {
        "name": "llama70b", "target": {"transport": "tcp", "address": "10.0.0.11"},
        "mount": "/var/lib/kvcache/llama70b", "mount_options": ["noatime", "noquota"],
        "engines": [{"kind": "lmcache", "cleaner": {"enabled": True}}]},
     "initiator.pools[0].engines[0].cleaner.enabled", "noquota"),
    ("gds-on-lmcache", f"{INI}.engines.0.gds", "trust", "initiator.pools[0].engines[0].gds",
     "only dynamo"),
    # Written out, even as the default value, an engine-only field on another engine is
    # refused: its writer expects it to do something there.
    ("gds-check-on-lmcache", f"{INI}.engines.0.gds", "check",
     "initiator.pools[0].engines[0].gds", "only dynamo"),
    ("gds-unknown", f"{INI}.engines", [{"kind": "dynamo", "gds": "ignore"}],
     "initiator.pools[0].engines[0].gds", "check"),
    ("bad-duration", f"{INI}.connect", {"reconnect_delay": "soon"},
     "initiator.pools[0].connect.reconnect_delay", "not a duration"),
    ("target-and-targets", f"{INI}.targets", [{"transport": "tcp", "address": "10.0.0.12"}],
     "initiator.pools[0].target", "not both"),
    # Fields that cannot apply: an engine-only field on another engine, contradicting mount
    # options, a fast-fail timeout the controller loss timeout would cut short.
    ("cpu-cache-on-lmcache", f"{INI}.engines.0.cpu_cache", "8GiB",
     "initiator.pools[0].engines[0].cpu_cache", "only vllm"),
    ("backend-on-lmcache", f"{INI}.engines.0.backend", "mooncake",
     "initiator.pools[0].engines[0].backend", "only sglang"),
    ("sglang-backend-unknown", f"{INI}.engines", [{"kind": "sglang", "backend": "nfs"}],
     "initiator.pools[0].engines[0].backend", "mooncake"),
    ("tensor-parallel-zero", f"{INI}.engines.0.tensor_parallel", 0,
     "initiator.pools[0].engines[0].tensor_parallel", "out of range 1-1024"),
    ("atime-contradiction", f"{INI}.mount_options", ["noatime", "relatime"],
     "initiator.pools[0].mount_options[1]", "contradicts 'noatime'"),
    ("quota-contradiction", f"{INI}.mount_options", ["prjquota", "noquota"],
     "initiator.pools[0].mount_options[1]", "contradicts 'prjquota'"),
    ("read-only-mount", f"{INI}.mount_options", ["ro"],
     "initiator.pools[0].mount_options[0]", "read-only"),
    ("fast-fail-not-below-loss", f"{INI}.connect",
     {"ctrl_loss_tmo": "10s", "fast_io_fail_tmo": "10s"},
     "initiator.pools[0].connect.fast_io_fail_tmo", "not below ctrl_loss_tmo"),
    # Input that crashed or spun the agent (issue 24, item 9): a list as a kind, NaN and
    # infinite durations, sizes and durations the kernel's types cannot hold.
    ("backing-kind-list", "target.pools.0.backing", {"kind": ["lvm"]},
     "target.pools[0].backing.kind", "a list is not one of"),
    ("interval-nan", "health.interval", float("nan"), "health.interval", "not a duration"),
    ("interval-inf", "health.interval", float("inf"), "health.interval", "not a duration"),
    ("ctrl-loss-inf", f"{INI}.connect", {"ctrl_loss_tmo": float("inf")},
     "initiator.pools[0].connect.ctrl_loss_tmo", "not a duration"),
    ("duration-over-int", "health.interval", "100000d", "health.interval", "longest timeout"),
    ("size-over-loff-t", "target.pools.0.namespaces.size", "10000000PiB",
     "target.pools[0].namespaces.size", "largest size"),
    ("size-int-over-loff-t", "target.pools.0.namespaces.size", 2**63,
     "target.pools[0].namespaces.size", "largest size"),
    ("capacity-nan", f"{INI}.engines.0.capacity", float("nan"),
     "initiator.pools[0].engines[0].capacity", "must be more than 0%"),
    # Option injection (issue 24, item 7): NQNs and interface names reach the kernel's
    # comma-separated connect options.
    ("nqn-with-comma", "target.pools.0.hosts.0.nqn", f"{HOST_A},traddr=203.0.113.9",
     "target.pools[0].hosts[0].nqn", "must not contain ',' or '='"),
    ("host-iface-injection", f"{INI}.connect", {"host_iface": "eth0,traddr=203.0.113.9"},
     "initiator.pools[0].connect.host_iface", "not a network interface name"),
    ("host-iface-too-long", f"{INI}.connect", {"host_iface": "a" * 16},
     "initiator.pools[0].connect.host_iface", "not a network interface name"),
    # Within the kernel's 15 characters: refused for the ',' or '=' alone.
    ("host-iface-comma", f"{INI}.connect", {"host_iface": "eth0,tos=1"},
     "initiator.pools[0].connect.host_iface", "not a network interface name"),
    ("host-iface-equals", f"{INI}.connect", {"host_iface": "eth0=1"},
     "initiator.pools[0].connect.host_iface", "not a network interface name"),
    ("nqn-with-equals", "target.pools.0.hosts.0.nqn", f"{HOST_A}=1",
     "target.pools[0].hosts[0].nqn", "must not contain ',' or '='"),
    ("bad-listen", "health.listen", "localhost", "health.listen", "host:port"),
    ("bad-referrals", f"{INI}.referrals", "always", "initiator.pools[0].referrals",
     "follow, ignore"),
    ("section-not-mapping", "health", ["listen"], "health", "mapping"),
]


@pytest.mark.parametrize(("case", "path", "value", "field", "words"), BROKEN,
                         ids=[b[0] for b in BROKEN])
def test_broken_config_is_refused_with_field_path(tmp_path: Path, case: str, path: str,
                                                  value: object, field: str,
                                                  words: str) -> None:
    data = base()
    if case == "duplicate-pool-name":
        data["target"]["pools"].append(dict(data["target"]["pools"][0]))
    else:
        _set(data, path, value)
    file = tmp_path / "kvagent.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if f": {field}: " in ln]
    assert lines, f"no message names {field!r}:\n{result.output}"
    assert any(words in ln for ln in lines), result.output
    assert all(ln.startswith(f"kvagent: config error: {file}:") for ln in lines)
    # The loader knows the line of every field it reports on here.
    assert all(re.match(rf"kvagent: config error: {re.escape(str(file))}:\d+: ", ln)
               for ln in lines), result.output


def test_message_gives_the_line_of_the_field(tmp_path: Path) -> None:
    text = yaml.safe_dump(base(), sort_keys=False).replace("transport: tcp\n",
                                                           "transport: tcpx\n", 1)
    with pytest.raises(ConfigError) as err:
        parse_config(text, "k.yaml")
    (problem,) = err.value.problems
    expected = 1 + text.splitlines().index(
        next(ln for ln in text.splitlines() if "tcpx" in ln))
    assert (problem.field, problem.line) == ("target.ports[0].transport", expected)


@pytest.mark.parametrize("options", [["noatime", "prjquota", "pquota"], ["rw", "nodev"]])
def test_options_that_agree_are_fine(options: list[str]) -> None:
    data = base()
    data["initiator"]["pools"][0]["mount_options"] = options
    assert parse_config(yaml.safe_dump(data)).initiator.pools[0].mount_options == tuple(options)


def test_fast_fail_below_a_finite_loss_timeout_is_fine() -> None:
    data = base()
    data["initiator"]["pools"][0]["connect"] = {"ctrl_loss_tmo": "60s", "fast_io_fail_tmo": "5s"}
    assert parse_config(yaml.safe_dump(data)).initiator.pools[0].connect.fast_io_fail_tmo == 5


def test_every_problem_is_reported_at_once() -> None:
    data = base()
    data["node"]["name"] = "BAD"
    data["health"]["listen"] = "nowhere"
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(data))
    assert {p.field for p in err.value.problems} == {"node.name", "health.listen"}


@pytest.mark.parametrize("text", ["version: 1\nnode: {name: a}\nnode: {name: b}\n",
                                  "version: 1\nnode: [unclosed\n", "", "- just\n- a list\n",
                                  "node: {name: a}\n"])
def test_malformed_files_exit_2_without_traceback(tmp_path: Path, text: str) -> None:
    file = tmp_path / "k.yaml"
    file.write_text(text)
    result = CliRunner().invoke(main, ["config", "validate", str(file)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "config error" in result.output


def test_missing_file_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["-c", str(tmp_path / "nope.yaml"), "config", "validate"])
    assert result.exit_code == 2
    assert "does not exist" in result.output


def test_config_env_variable_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "env.yaml"
    file.write_text("version: 1\nnode: {name: from-env}\n")
    monkeypatch.setenv("KVAGENT_CONFIG", str(file))
    assert load_config().node.name == "from-env"
    result = CliRunner().invoke(main, ["-o", "json", "config", "validate"])
    assert result.exit_code == 0 and '"node": "from-env"' in result.output


def test_nqn_length_limit_checked_on_derived_subsystem_nqns() -> None:
    data = base()
    data["node"]["nqn_prefix"] = "nqn.2026-11.com." + "a" * 150
    data["node"]["name"] = "n" * 32
    data["target"]["pools"][0]["name"] = "p" * 32
    data["target"]["pools"][0]["hosts"][0]["name"] = "h" * 10
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(data))
    assert err.value.problems[0].field == "target.pools[0].hosts[0].name"
    assert "223" in err.value.problems[0].message


def test_shared_pool_allows_any_host_and_device_entries_without_host() -> None:
    data = base()
    pool = data["target"]["pools"][0]
    pool.update(shared=True, allow_any_host=True, hosts=[])
    pool["backing"] = {"kind": "device", "devices": [{"path": "/dev/disk/by-id/wwn-0x5000c5"}]}
    del pool["namespaces"]
    cfg = parse_config(yaml.safe_dump(data))
    assert cfg.target.pools[0].allow_any_host


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12) | st.floats(),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=10,
)


@given(section=st.sampled_from(["node", "target", "initiator", "health"]), value=yaml_values)
def test_random_sections_never_crash(section: str, value: object) -> None:
    """Any YAML value in any section yields a config or a ConfigError, nothing else."""
    text = yaml.safe_dump({"version": 1, section: value})
    try:
        parse_config(text)
    except ConfigError as exc:
        assert exc.problems and all(p.field for p in exc.problems)


@pytest.mark.parametrize("argv", [
    ["config", "validate", "-o", "json", "EXAMPLE"],
    ["config", "validate", "EXAMPLE", "--output", "json"],
    ["-o", "text", "config", "validate", "EXAMPLE", "-o", "json"],
])
def test_output_option_may_follow_the_subcommand(argv: list[str]) -> None:
    example = str(EXAMPLES[0])
    result = CliRunner().invoke(main, [example if a == "EXAMPLE" else a for a in argv])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["valid"] is True


SYSTEM_DIRS = ["/", "/etc", "/usr", "/boot", "/proc", "/sys", "/dev", "/run", "/var", "/bin",
               "/sbin", "/lib", "/lib64", "/home", "/root", "/tmp", "/srv", "/opt", "/mnt",
               "/media"]


@pytest.mark.parametrize("mount", [*SYSTEM_DIRS, "/etc/", "//usr//", "/var/./",
                                   "/proc/self", "/sys/kernel/config/kv", "/dev/shm/kv",
                                   "/dev/disk/by-id/x"])
def test_mount_root_over_a_system_directory_is_refused(tmp_path: Path, mount: str) -> None:
    """Mounting a pool over /etc, /var, ... would hide the system; under /proc etc. too."""
    data = base()
    data["initiator"]["pools"][0]["mount"] = mount
    file = tmp_path / "kvagent.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ": initiator.pools[0].mount: " in ln]
    assert "system directory" in line or "kernel filesystem" in line, line


@pytest.mark.parametrize("mount", ["/var/lib/kvcache/kv", "/mnt/kv", "/srv/kvcache",
                                   "/opt/kv", "/media/nvme", "/tmp/kvtest/mnt", "/home/kv",
                                   "/run/kvcache", "/devices", "/system", "/proc2"])
def test_mount_root_below_a_system_directory_is_fine(mount: str) -> None:
    """Only the directories themselves (and anything under /proc, /sys, /dev) are refused."""
    data = base()
    data["initiator"]["pools"][0]["mount"] = mount
    cfg = parse_config(yaml.safe_dump(data))
    assert cfg.initiator.pools[0].mount == mount


# ------------------------------------------------------------------ who wrote the file
@pytest.mark.parametrize(("mode", "uid", "gid", "words"), [
    (0o666, 0, 0, "writable by its group or by everyone (mode 0666"),
    (0o664, 0, 100, "mode 0664, group 100"),
    (0o644, 1000, 0, "owned by uid 1000, not root"),
])
def test_root_refuses_a_config_others_can_change(tmp_path: Path, mode: int, uid: int,
                                                 gid: int, words: str) -> None:
    """Issue 24, item 15: a 0666 file, or a user's file, was loaded by the root daemon."""
    if os.geteuid() != 0:
        pytest.skip("the rule is root's; this test needs root to chown")
    file = tmp_path / "kvagent.yaml"
    file.write_text(yaml.safe_dump(base(), sort_keys=False))
    os.chmod(file, mode)
    os.chown(file, uid, gid)
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert f"kvagent: config error: {file}: (file): " in result.stderr and words in result.stderr
    assert "Traceback" not in result.output


def test_root_takes_its_own_file_and_others_any(tmp_path: Path) -> None:
    import stat as st_

    from agent.config import trust_problem

    def status(mode: int, uid: int, gid: int = 0) -> os.stat_result:
        return os.stat_result((st_.S_IFREG | mode, 0, 0, 1, uid, gid, 10, 0, 0, 0))

    assert trust_problem(status(0o644, 0), 0) is None
    assert trust_problem(status(0o664, 0), 0) is None  # root's group: a checkout's umask 002
    assert "group 100" in trust_problem(status(0o664, 0, 100), 0)
    assert trust_problem(status(0o600, 0), 0) is None
    assert trust_problem(status(0o666, 1000), 1000) is None  # not root: its own business
    assert "uid 1000" in trust_problem(status(0o600, 1000), 0)


def test_a_config_file_larger_than_the_cap_is_refused(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.config import load

    monkeypatch.setattr(load, "MAX_CONFIG_BYTES", 64)
    file = tmp_path / "kvagent.yaml"
    file.write_text("version: 1\n" + "# padding\n" * 20)
    with pytest.raises(ConfigError, match="larger than"):
        load.load_config(file)


def _overlap_pairs_by_comparing_all(paths: list[str]) -> list[tuple[int, int]]:
    """The definition: every pair compared (one path is the other or under it)."""
    return [(i, j) for i, a in enumerate(paths) for j, b in enumerate(paths)
            if j < i and (a == b or a.startswith(b.rstrip("/") + "/")
                          or b.startswith(a.rstrip("/") + "/"))]


@given(st.lists(st.lists(st.sampled_from(["a", "b", "ab", "c"]), max_size=4)
                .map(lambda parts: "/" + "/".join(parts)), max_size=12))
def test_overlapping_mounts_are_the_pairs_a_comparison_of_all_finds(paths: list[str]) -> None:
    from agent.config.model import overlapping_paths
    assert overlapping_paths(paths) == _overlap_pairs_by_comparing_all(paths)


def test_overlapping_initiator_mounts_are_refused_naming_both_pools() -> None:
    data = base()
    pool = data["initiator"]["pools"][0]
    data["initiator"]["pools"] = [
        {**pool, "name": "a", "mount": "/cache/kv"},
        {**pool, "name": "b", "mount": "/cache/kvx"},
        {**pool, "name": "c", "mount": "/cache/kv/c"},
        {**pool, "name": "d", "mount": "/cache"},
    ]
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_dump(data))
    assert [(p.field, p.message) for p in err.value.problems] == [
        ("initiator.pools[2].mount", "/cache/kv/c overlaps the mount of pools[0] (/cache/kv)"),
        ("initiator.pools[3].mount", "/cache overlaps the mount of pools[0] (/cache/kv)"),
        ("initiator.pools[3].mount", "/cache overlaps the mount of pools[1] (/cache/kvx)"),
        ("initiator.pools[3].mount", "/cache overlaps the mount of pools[2] (/cache/kv/c)"),
    ]


# ------------------------------------------------- kvagent's own directories (F4)
@pytest.mark.parametrize("field", ["state_dir", "run_dir"])
@pytest.mark.parametrize("path", ["/", "/etc", "/run", "/tmp", "/var", "/home", "/root",
                                  "/srv", "/data", "/var/lib", "/var/run", "/var/tmp",
                                  "/run/user", "/home/alice", "/etc/kvagent", "/usr/local/kv",
                                  "/boot/kv", "/sys/kv", "/dev/shm/kv", "/proc/1", "//etc/",
                                  "/var/./lib"])
def test_a_system_directory_as_kvagents_own_is_refused(tmp_path: Path, field: str,
                                                        path: str) -> None:
    """Issue 35, F4: node.run_dir or state_dir of /, /etc, /run or /tmp was accepted, then
    made private to root (chmod 0700)."""
    data = base()
    data["node"][field] = path
    file = tmp_path / "kvagent.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(main, ["-c", str(file), "config", "validate"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [ln for ln in result.stderr.splitlines() if f": node.{field}: " in ln]
    assert "the system's own files" in line or "which others use too" in line, line
    assert "give a directory of kvagent's own, e.g. " in line


@pytest.mark.parametrize("path", ["/var/lib/kvagent", "/run/kvagent", "/srv/kvagent/state",
                                  "/home/alice/kvagent", "/tmp/kvtest/run", "/var/lib/x/y",
                                  "/opt/kvagent/run", "/mnt/data/kvagent"])
def test_a_directory_of_kvagents_own_is_fine(path: str) -> None:
    data = base()
    data["node"].update(state_dir=path, run_dir=path + "-run")
    cfg = parse_config(yaml.safe_dump(data))
    assert (cfg.node.state_dir, cfg.node.run_dir) == (path, path + "-run")
