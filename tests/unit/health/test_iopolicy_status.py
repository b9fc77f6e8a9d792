"""``kvagent status`` shows each controller's subsystem multipath I/O policy (JSON, text),
read from sysfs by the collector."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jsonschema

from agent.config import parse_config
from agent.fabrics import FabricsAddress
from agent.health.collect import Topology, _initiator_pool
from agent.health.status import load_status_schema, render_status_text, to_status_json
from agent.initiator.sysfs import Sysfs
from agent.records import PoolAttachment, SubsystemPath
from agent.system.xfsquota import XfsQuota
from tests.unit.health import samples
from tests.unit.initiator.fakesysfs import FakeSysfs

HOST = "nqn.2014-08.org.nvmexpress:uuid:11e85052-8716-44d9-b10e-1c51bae17688"


def test_status_json_and_text_show_the_iopolicy() -> None:
    snap = samples.healthy()
    snap = dataclasses.replace(snap, controllers=tuple(
        dataclasses.replace(c, iopolicy="round-robin") for c in snap.controllers))
    doc = to_status_json(snap)
    schema = load_status_schema()
    jsonschema.validators.validator_for(schema)(schema).validate(doc)
    assert [c["iopolicy"] for c in doc["controllers"]] == ["round-robin", "round-robin"]
    rows = [line.split() for line in render_status_text(snap).splitlines()]
    header = next(r for r in rows if r[:1] == ["CONTROLLER"])
    assert header[5] == "IOPOLICY"
    assert [r[5] for r in rows if r[:1] in (["nvme1"], ["nvme2"])] == ["round-robin"] * 2
    # Unknown (a kernel without native multipath): null, and '-' in the table.
    none = to_status_json(samples.healthy())
    assert none["controllers"][0]["iopolicy"] is None


def test_the_collector_reads_the_policy_of_each_controllers_subsystem(tmp_path: Path) -> None:
    nqn = samples.NQN
    sysfs = FakeSysfs(tmp_path / "sys")
    for inst, addr in ((1, "10.0.0.1"), (2, "10.0.1.1")):
        sysfs.add_controller(inst, subsysnqn=nqn, hostnqn=HOST,
                             address=f"traddr={addr},trsvcid=4420")
    sysfs.add_subsystem(1, nqn, controllers=(1, 2), iopolicy="round-robin")
    sysfs.add_controller(3, subsysnqn="nqn.other", hostnqn=HOST)
    sysfs.add_subsystem(3, "nqn.other", controllers=(3,), iopolicy="numa")
    cfg = parse_config(f"""
version: 1
node: {{name: gpu1, state_dir: {tmp_path}/state, sysfs: {tmp_path}/sys}}
initiator:
  pools:
    - {{name: kv, target: {{transport: tcp, address: 10.0.0.1}}, mount: /srv/kv,
       iopolicy: round-robin}}
""")
    record = PoolAttachment(HOST, "per-namespace", False,
                            subsystems=[SubsystemPath(nqn, FabricsAddress("tcp", "10.0.0.1",
                                                                          "4420"))])
    sysfs = Sysfs(tmp_path / "sys")
    topo = Topology(state={"kv": record}, controllers=tuple(sysfs.controllers()),
                    policies={s.nqn: s.iopolicy for s in sysfs.subsystems_of(nqn)})
    _, ctrls = _initiator_pool(cfg, cfg.initiator.pools[0], record, topo, XfsQuota())
    assert [(c.name, c.iopolicy) for c in ctrls] == [("nvme1", "round-robin"),
                                                    ("nvme2", "round-robin")]
