"""Calibrate the simulator's machine profile for this host behind a shaped network, from
microbenchmarks and local runs only (docs/simulator.md, "Calibrating this host").

    python bench/calibrate_machine.py --rate 1gbit[,250mbit] [--links shared|per-node] \\
        --compute-runs RUN [RUN ...] --out profile.json [--reps 5]

Per rate: ``bench/feature_gather.py --calibrate`` (3 ranks, each an emulated node) runs behind
``python -m rudder.netem --rate R --links L``; its round trips (alone, and with a bulk read
filling the link), bulk bandwidth and Get call cost become the machine's link figures. The CPU
costs of a step (sampling, assembly, blocks, forward+backward+optimiser) are fitted on the
``--compute-runs``: unshaped drivers/train.py runs with ``--no-overlap`` and every rank on one node
(MPIR_CVAR_NUM_CLIQUES=1), from the CPU seconds their threads logged (one core's figures,
whatever the trainers of such a run took from each other): those without a buffer (``--policy
none``) for the step, each with a buffer for what its policy's buffer adds to the assembly. The
profile keeps the core count, with which the simulator slows CPU work down again.
``python -m rudder.simulate --machine profile.json`` then takes the
machine of the run's rate (``--validate``: from RUN/netem.json) or of ``--rate``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.mpi_job import MPIEXEC, shaped  # noqa: E402
from rudder.sim.calibration import fit_cpu, link_figures  # noqa: E402
from rudder.sim.machine import Machine, parse_rate, save_profile  # noqa: E402

NODE_BANDWIDTH = 5e9  # on-node rows (shared memory): not measured; unused when every trainer is a node


def probe_link(rate: str, links: str, reps: int) -> tuple[dict, list[str]]:
    """feature_gather.py --calibrate behind the shaping: its JSON line, and the command."""
    py = sys.executable
    cmd = [*shaped(rate, links, 3),
           MPIEXEC, "-n", "3", py, "-m", "mpi4py",
           os.path.join(REPO, "bench", "feature_gather.py"), "--calibrate", "--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO))
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{"))), cmd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", required=True, help="comma-separated netem rates (1gbit,250mbit)")
    ap.add_argument("--links", default="shared", choices=("shared", "per-node"))
    ap.add_argument("--compute-runs", nargs="+", required=True, metavar="RUN")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rates = [r.strip() for r in a.rate.split(",") if r.strip()]
    bits = [parse_rate(r) for r in rates]
    t = time.time()
    cpu = fit_cpu(a.compute_runs, os.cpu_count() or 1)
    provenance = cpu.pop("calibration")
    print(f"CPU fit on {len(a.compute_runs)} local runs' {' and '.join(provenance['seconds'])} seconds "
          f"({time.time() - t:.0f} s): " + ", ".join(f"{k} {v:.3g}" for k, v in cpu.items() if k != "buffer_cpu")
          + "".join(f"; buffer of {work}: {a * 1e3:.3g} ms + {b * 1e6:.3g} us an input node"
                    for work, (a, b) in cpu["buffer_cpu"].items()))
    machines = []
    for rate, rate_bit in zip(rates, bits):
        t = time.time()
        probe, cmd = probe_link(rate, a.links, a.reps)
        link = link_figures(probe)
        print(f"{a.links} {rate} ({time.time() - t:.0f} s): round trip {link['latency'] * 1e3:.2f} ms "
              f"({link['loaded_latency'] * 1e3:.2f} ms with the link full), {link['bandwidth'] * 8 / 1e9:.3f} Gbit/s "
              f"({link['bandwidth'] * 8 / rate_bit:.3f} of the rate), {link['get_call'] * 1e6:.1f} us a Get call")
        machines.append(Machine(name=f"host-{a.links}-{rate}", ranks_per_node=1, node_bandwidth=NODE_BANDWIDTH,
                                links=a.links, rate=rate, rate_bit=rate_bit, **link, **cpu,
                                calibration={**provenance, "link_probe": probe, "link_command": " ".join(cmd),
                                             "cores": os.cpu_count(), "load_average": os.getloadavg()[0],
                                             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}))
    save_profile(a.out, machines)
    print(f"wrote {a.out}: {', '.join(m.name for m in machines)}")


if __name__ == "__main__":
    main()
