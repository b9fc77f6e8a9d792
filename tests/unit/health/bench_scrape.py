"""Benchmark (not a test): /metrics scrape latency over 1,000 scrapes with 16 pools.

Run from the repository root: ``.venv/bin/python -m tests.unit.health.bench_scrape``
(``--pools N``, ``--scrapes N``). A converged host: N pools on both roles, 2 controllers
per initiator pool, 8 local drives; one keep-alive connection on 127.0.0.1, one
snapshot; per format: the Prometheus text format, OpenMetrics as Prometheus 3 asks for
it, each plain and with ``Accept-Encoding: gzip``.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import time

from agent.health.server import HealthServer, SnapshotStore
from agent.log import configure_logging
from tests.unit.health import samples

OPENMETRICS = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
               "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
MODES = {"text": {}, "text+gzip": {"Accept-Encoding": "gzip"},
         "openmetrics": {"Accept": OPENMETRICS},
         "openmetrics+gzip": {"Accept": OPENMETRICS, "Accept-Encoding": "gzip"}}


def snapshot(pools: int = 16):
    ps, ctrls = [], []
    for i in range(pools):
        name = f"pool{i:02d}"
        ps += [samples.target_pool(name=name), samples.initiator_pool(name=name)]
        for c in samples.controllers():
            ctrls.append(dataclasses.replace(c, name=f"nvme{len(ctrls) + 1}", pool=name))
    drives = tuple(samples.drive(device=f"/dev/nvme{100 + i}") for i in range(8))
    return dataclasses.replace(samples.healthy(), pools=tuple(ps), controllers=tuple(ctrls),
                               drives=drives)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pools", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=1000)
    args = parser.parse_args()
    configure_logging(0)
    with HealthServer(SnapshotStore(snapshot(args.pools)), host="127.0.0.1",
                      port=0) as server:
        for mode, headers in MODES.items():
            conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
            times, body = [], b""
            for _ in range(args.scrapes):
                started = time.perf_counter()
                conn.request("GET", "/metrics", headers=headers)
                body = conn.getresponse().read()
                times.append(time.perf_counter() - started)
            conn.close()
            times.sort()
            print(f"{mode:17} pools={args.pools} scrapes={args.scrapes} bytes={len(body)} "
                  f"p50={times[len(times) // 2] * 1000:.2f}ms "
                  f"p99={times[int(len(times) * 0.99) - 1] * 1000:.2f}ms "
                  f"max={times[-1] * 1000:.2f}ms total={sum(times):.2f}s")


if __name__ == "__main__":
    main()
