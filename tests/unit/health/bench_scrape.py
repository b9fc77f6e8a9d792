"""Benchmark (not a test): /metrics scrape latency over 1,000 scrapes with 16 pools.

Run from the repository root: ``.venv/bin/python -m tests.unit.health.bench_scrape``.
A converged host: 16 pools on both roles (32 pool entries), 2 controllers per
initiator pool (32), 8 local drives; one keep-alive connection on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import http.client
import time

from agent.health.server import HealthServer, SnapshotStore
from agent.log import configure_logging
from tests.unit.health import samples

POOLS = 16
SCRAPES = 1000


def snapshot():
    pools, ctrls = [], []
    for i in range(POOLS):
        name = f"pool{i:02d}"
        pools += [samples.target_pool(name=name), samples.initiator_pool(name=name)]
        for c in samples.controllers():
            ctrls.append(dataclasses.replace(c, name=f"nvme{len(ctrls) + 1}", pool=name))
    drives = tuple(samples.drive(device=f"/dev/nvme{100 + i}") for i in range(8))
    return dataclasses.replace(samples.healthy(), pools=tuple(pools), controllers=tuple(ctrls),
                               drives=drives)


def main() -> None:
    configure_logging(0)
    with HealthServer(SnapshotStore(snapshot()), host="127.0.0.1", port=0) as server:
        conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
        times, body = [], b""
        for _ in range(SCRAPES):
            started = time.perf_counter()
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            times.append(time.perf_counter() - started)
        conn.close()
    times.sort()
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(f"pools={POOLS} scrapes={SCRAPES} bytes={len(body)} series={series} "
          f"p50={times[len(times) // 2] * 1000:.2f}ms "
          f"p99={times[int(len(times) * 0.99) - 1] * 1000:.2f}ms max={times[-1] * 1000:.2f}ms")


if __name__ == "__main__":
    main()
