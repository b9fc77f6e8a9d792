"""Engine directories (mode, owner, idempotency, refusals), capacity caps and usage."""

from __future__ import annotations

import os
import pwd
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import failpoints
from agent.config.model import EngineConfig
from agent.config.types import AccountName, FileMode, Percent
from agent.engines.dirs import (
    engine_capacities,
    prepare,
    prepare_subdirectories,
    usage,
    usage_sample,
)
from agent.errors import KvagentError, UsageError


def engine(kind: str = "lmcache", capacity: float | None = None, mode: int = 0o750,
           owner: str | None = None, group: str | None = None) -> EngineConfig:
    return EngineConfig(
        kind=kind,  # type: ignore[arg-type]
        owner=AccountName(owner if owner is not None else str(os.getuid())),
        group=AccountName(group if group is not None else str(os.getgid())),
        mode=FileMode(mode),
        capacity=Percent(capacity) if capacity is not None else None,
    )


def mounts(tmp_path, n: int = 2) -> list[str]:
    out = []
    for i in range(n):
        d = tmp_path / f"ns{i}"
        d.mkdir()
        out.append(str(d))
    return out


# ------------------------------------------------------------------ directories

def test_prepare_creates_with_mode_and_owner(tmp_path) -> None:
    ms = mounts(tmp_path)
    result = prepare(ms, engine(mode=0o750), require_mount=False)
    assert [r.path for r in result] == [os.path.join(m, "lmcache") for m in ms]
    for r in result:
        st_ = os.stat(r.path)
        assert stat.S_ISDIR(st_.st_mode)
        assert stat.S_IMODE(st_.st_mode) == 0o750
        assert (st_.st_uid, st_.st_gid) == (os.getuid(), os.getgid())
        assert r.changes == ("created",) and r.changed


def test_subdirectories_are_made_inside_the_engine_directory(tmp_path) -> None:
    ms = mounts(tmp_path)
    prepare(ms, engine(), require_mount=False)
    want = [os.path.join(ms[0], "lmcache", "r", "rank_0"), os.path.join(ms[1], "lmcache", "r1")]
    made = prepare_subdirectories(want, ms, engine(mode=0o750))
    assert [p.path for p in made] == [os.path.join(ms[0], "lmcache", "r"), want[0], want[1]]
    for p in want:
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o750
    assert not any(p.changes for p in prepare_subdirectories(want, ms, engine(mode=0o750)))


@pytest.mark.parametrize("path", ["/etc/rank_0", "{m}/other/rank_0", "{m}/lmcache",
                                  "{m}/lmcache/../vllm/x", "{m}/lmcache/a/"])
def test_subdirectories_outside_the_engine_directory_are_refused(tmp_path, path) -> None:
    ms = mounts(tmp_path)
    prepare(ms, engine(), require_mount=False)
    with pytest.raises(KvagentError, match="not inside the lmcache engine's directories"):
        prepare_subdirectories([path.format(m=ms[0])], ms, engine())
    assert not os.path.exists(os.path.join(ms[0], "vllm"))


def test_a_symlink_on_the_way_to_a_subdirectory_is_refused(tmp_path) -> None:
    ms = mounts(tmp_path)
    prepare(ms, engine(), require_mount=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, os.path.join(ms[0], "lmcache", "r"))
    with pytest.raises(KvagentError, match="is a symlink"):
        prepare_subdirectories([os.path.join(ms[0], "lmcache", "r", "rank_0")], ms, engine())
    assert list(elsewhere.iterdir()) == []


def test_a_symlink_deeper_on_the_way_is_refused(tmp_path) -> None:
    ms = mounts(tmp_path, 1)
    prepare(ms, engine(), require_mount=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.makedirs(os.path.join(ms[0], "lmcache", "a"))
    os.symlink(elsewhere, os.path.join(ms[0], "lmcache", "a", "b"))
    with pytest.raises(KvagentError, match=r"lmcache/a/b exists and is a symlink"):
        prepare_subdirectories([os.path.join(ms[0], "lmcache", "a", "b", "c", "rank_0")], ms,
                               engine())
    assert list(elsewhere.iterdir()) == []


def test_a_directory_swapped_for_a_symlink_midway_leads_nowhere_outside(tmp_path,
                                                                       monkeypatch) -> None:
    """F2 (issue 35): the engine's user owns its directory and swaps ``r`` for a link to a
    directory outside right after kvagent made and fixed ``r``, before it makes
    ``r/rank_0``. Each component is made and changed through the descriptor of the one
    above, opened from the mount down without following links: nothing is made, owned or
    moded outside (before the fix ``rank_0`` was made there and given the engine's owner)."""
    ms = mounts(tmp_path, 1)
    root = os.path.join(ms[0], "sglang")
    owner = "1000" if os.geteuid() == 0 else str(os.getuid())
    prepare(ms, engine("sglang", owner=owner), require_mount=False)
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o755)
    before = os.stat(outside)
    real_step = failpoints.step

    def swap_after_r(kind: str, subject: str = "") -> None:
        real_step(kind, subject)
        if kind == "dir.mode" and subject == os.path.join(root, "r"):
            os.rename(subject, subject + ".moved")
            os.symlink(outside, subject)

    monkeypatch.setattr(failpoints, "step", swap_after_r)
    # Made in the directory kvagent opened (now r.moved, still the engine's), or refused.
    try:
        prepare_subdirectories([os.path.join(root, "r", "rank_0")], ms,
                               engine("sglang", owner=owner, mode=0o750))
        assert os.path.isdir(os.path.join(root, "r.moved", "rank_0"))
    except KvagentError as exc:
        assert "exists and is a symlink" in exc.message
    assert list(outside.iterdir()) == []
    after = os.stat(outside)
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid,
                                                           before.st_mode)


def test_prepare_twice_changes_nothing(tmp_path) -> None:
    ms = mounts(tmp_path)
    prepare(ms, engine(), require_mount=False)
    again = prepare(ms, engine(), require_mount=False)
    assert [r.changed for r in again] == [False, False]


def test_prepare_fixes_mode_drift_and_says_so(tmp_path) -> None:
    ms = mounts(tmp_path, 1)
    (first,) = prepare(ms, engine(mode=0o750), require_mount=False)
    os.chmod(first.path, 0o777)
    (fixed,) = prepare(ms, engine(mode=0o750), require_mount=False)
    assert fixed.changes == ("mode 0777 -> 0750",)
    assert stat.S_IMODE(os.stat(first.path).st_mode) == 0o750


def test_prepare_resolves_owner_by_name(tmp_path) -> None:
    name = pwd.getpwuid(os.getuid()).pw_name
    (r,) = prepare(mounts(tmp_path, 1), engine(owner=name), require_mount=False)
    assert r.uid == os.getuid() == os.stat(r.path).st_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
def test_prepare_fixes_owner_drift(tmp_path) -> None:
    ms = mounts(tmp_path, 1)
    (r,) = prepare(ms, engine(), require_mount=False)
    os.chown(r.path, 65534, 65534)
    (fixed,) = prepare(ms, engine(), require_mount=False)
    assert fixed.changes == (f"owner 65534:65534 -> {os.getuid()}:{os.getgid()}",)
    assert (os.stat(r.path).st_uid, os.stat(r.path).st_gid) == (os.getuid(), os.getgid())


def test_prepare_refuses_a_symlink_and_leaves_it(tmp_path) -> None:
    (m,) = mounts(tmp_path, 1)
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(target, os.path.join(m, "lmcache"))
    with pytest.raises(KvagentError, match="is a symlink"):
        prepare([m], engine(), require_mount=False)
    assert os.path.islink(os.path.join(m, "lmcache"))


def test_prepare_refuses_a_file(tmp_path) -> None:
    (m,) = mounts(tmp_path, 1)
    with open(os.path.join(m, "vllm"), "w") as f:
        f.write("data")
    with pytest.raises(KvagentError, match="not a directory"):
        prepare([m], engine("vllm"), require_mount=False)
    with open(os.path.join(m, "vllm")) as f:
        assert f.read() == "data"


def test_prepare_needs_a_mount_point_by_default(tmp_path) -> None:
    ms = mounts(tmp_path, 1)
    with pytest.raises(KvagentError, match="not a mount point"):
        prepare(ms, engine())
    assert os.listdir(ms[0]) == []


def test_prepare_needs_the_mount_directory(tmp_path) -> None:
    with pytest.raises(KvagentError, match="does not exist"):
        prepare([str(tmp_path / "missing")], engine(), require_mount=False)


def test_unknown_owner_is_a_usage_error(tmp_path) -> None:
    ms = mounts(tmp_path, 1)
    with pytest.raises(UsageError, match="no such user"):
        prepare(ms, engine(owner="no-such-user-kvagent"), require_mount=False)
    with pytest.raises(UsageError, match="no such group"):
        prepare(ms, engine(group="no-such-group-kvagent"), require_mount=False)
    assert os.listdir(ms[0]) == []


# ------------------------------------------------------------------ capacities

def test_default_is_ninety_percent_split_evenly() -> None:
    caps = engine_capacities(1000, [engine("lmcache"), engine("vllm")])
    assert caps == {"lmcache": 450, "vllm": 450}


def test_explicit_share_and_the_rest_split() -> None:
    caps = engine_capacities(10**12, [engine("lmcache", 50), engine("vllm"), engine("dynamo")])
    assert caps == {"lmcache": 500 * 10**9, "vllm": 200 * 10**9, "dynamo": 200 * 10**9}


def test_explicit_shares_only() -> None:
    caps = engine_capacities(10**12, [engine("sglang", 30), engine("mooncake", 60)])
    assert caps == {"sglang": 300 * 10**9, "mooncake": 600 * 10**9}


def test_rounding_goes_down() -> None:
    # 90% of 1001 is 900.9: 900 bytes for three engines, 300 each.
    assert engine_capacities(1001, [engine("lmcache"), engine("vllm"), engine("dynamo")]) == {
        "lmcache": 300, "vllm": 300, "dynamo": 300}
    # 33.3% of 1000 is 333.
    assert engine_capacities(1000, [engine("lmcache", 33.3)]) == {"lmcache": 333}


def test_nothing_left_for_engines_without_a_share() -> None:
    with pytest.raises(UsageError, match="vllm have no capacity left"):
        engine_capacities(10**12, [engine("lmcache", 90), engine("vllm")])


def test_more_than_ninety_percent_is_refused() -> None:
    with pytest.raises(UsageError, match="at most 90%"):
        engine_capacities(10**12, [engine("lmcache", 50), engine("vllm", 45)])


@given(pool=st.integers(min_value=10**6, max_value=10**16),
       shares=st.lists(st.one_of(st.none(), st.integers(min_value=1, max_value=30)),
                       min_size=1, max_size=3))
def test_total_never_exceeds_ninety_percent(pool: int, shares: list[int | None]) -> None:
    kinds = ["lmcache", "vllm", "dynamo"]
    engines = [engine(kinds[i], s) for i, s in enumerate(shares)]
    caps = engine_capacities(pool, engines)
    assert sum(caps.values()) * 100 <= pool * 90
    assert list(caps) == kinds[: len(shares)]


# ------------------------------------------------------------------ usage

def test_usage_counts_allocated_bytes_not_apparent_size(tmp_path) -> None:
    root = tmp_path / "engine"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "data.bin").write_bytes(os.urandom(1 << 20))
    with open(root / "sparse.bin", "wb") as f:
        f.truncate(100 << 20)  # 100 MiB apparent, nothing allocated
    used = usage(str(root))
    assert (1 << 20) <= used < (2 << 20)


def test_usage_does_not_follow_symlinks(tmp_path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(4 << 20))
    root = tmp_path / "engine"
    root.mkdir()
    os.symlink(outside, root / "link")
    assert usage(str(root)) < (1 << 20)


def test_usage_is_a_bounded_sample(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A health collect stats at most ``limit`` entries, whatever an engine stores."""
    root = tmp_path / "lmcache"
    (root / "sub").mkdir(parents=True)
    for i in range(30):
        (root / "sub" / f"f{i}").write_bytes(b"x" * 4096)
    full, seen, complete = usage_sample(str(root))
    assert (seen, complete) == (31, True) and full == usage(str(root)) >= 30 * 4096
    part, seen, complete = usage_sample(str(root), limit=10)
    assert (seen, complete) == (10, False) and 0 < part < full
    assert usage(str(root), limit=10) == part
