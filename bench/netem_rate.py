"""Benchmark (not a test): does a shaped network carry one-sided RMA at the rate it is shaped to?

    python bench/netem_rate.py [--size-mib 32] [--gets 6] [--rates 10gbit,1gbit,250mbit]

For each topology (one shared link, a link per node) and each rate, runs bench/rma_gets.py under
``python -m rudder.netem --rate R --links L -- mpiexec -n 2 ...``: rank 0 Gets SIZE MiB from rank 1
(another emulated node) GETS times. Prints, per configuration, the median achieved rate of the
Gets after the first (payload bits over Get+Flush seconds), its ratio to the shaped rate, the bytes
the shaped links counted against the payload, and the 4-byte Get round trip; one run, side by
side, with a 100gbit row per topology as the host's own ceiling (a rate the CPUs cannot reach is
capped there, not by the shaping). The payload ratio cannot reach 1: Ethernet, IP and TCP headers take their share of the shaped
rate (about 4% at MTU 1500), and tbf counts them (docs/network.md has measured numbers)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from bench.mpi_job import MPIEXEC  # noqa: E402

PROBE = os.path.join(REPO, "bench", "rma_gets.py")
CEILING = "100gbit"  # far above what two ranks on this host move: what the host itself can do, for reference


def measure(links: str, rate: str, size: int, gets: int) -> dict:
    with tempfile.TemporaryDirectory() as work:
        stats_path = os.path.join(work, "stats.json")
        proc = subprocess.run([sys.executable, "-m", "rudder.netem", "--rate", rate, "--links", links, "--stats",
                               stats_path, "--", MPIEXEC, "-n", "2", sys.executable, PROBE, str(size), str(gets)],
                              capture_output=True, text=True, timeout=1200,
                              env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO))
        if proc.returncode:
            raise SystemExit(f"{links} {rate} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        stats = json.load(open(stats_path))
    probe = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    achieved = statistics.median(size * 8 / s for s in probe["get_seconds"][1:])
    return {"links": links, "rate": rate, "rate_bit": stats["rate_bit"], "achieved_bit": achieved,
            "ratio": achieved / stats["rate_bit"], "crossed_over_payload": stats["crossed_bytes"] / probe["bytes"],
            "small_get_us": probe["small_get_us"], "ranks_on_rank0_node": probe["ranks_on_my_node"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=32)
    ap.add_argument("--gets", type=int, default=6, help="Gets per configuration (the first is not counted)")
    ap.add_argument("--rates", default="10gbit,1gbit,250mbit")
    ap.add_argument("--json", default=None, help="also write the results here")
    a = ap.parse_args()
    rows = [measure(links, rate, a.size_mib << 20, a.gets) for links in ("shared", "per-node")
            for rate in [*a.rates.split(","), CEILING]]
    print(f"{'links':<9} {'shaped':>8} {'achieved':>13} {'achieved/shaped':>16} {'achieved/ceiling':>17} "
          f"{'shaped bytes/payload':>21} {'4 B Get':>9}")
    for r in rows:
        assert r["ranks_on_rank0_node"] == 1, "the peer rank was not on another emulated node"
        ceiling = next(c for c in rows if c["links"] == r["links"] and c["rate"] == CEILING)["achieved_bit"]
        print(f"{r['links']:<9} {r['rate']:>8} {r['achieved_bit'] / 1e9:>8.3f} Gbit/s {r['ratio']:>16.3f} "
              f"{r['achieved_bit'] / ceiling:>17.3f} {r['crossed_over_payload']:>21.3f} {r['small_get_us']:>6.0f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
