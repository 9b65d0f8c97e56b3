"""What a job script launches on each node, asked at job start by jobscripts/rudder-job.sh (no
MPI, no torch): whether the policy needs an agent rank a node, the tasks a node and the CPUs a
task, printed as shell assignments.

    python -m rudder.train.launch --policy tuner --trainers-per-node 4 --cpus 128 --threads-per-core 2
    agents=1 tasks_per_node=5 cpus_per_task=24

Whether a policy needs an agent is the policy registry's ``needs_agent``, so every agent policy,
one a user registers included, gets its agent rank without a second list in shell.

CPUs a task: Slurm counts each hardware thread as a CPU, but with ``SelectTypeParameters=CR_Core``
or ``CR_Core_Memory`` (the usual setting on nodes with hyper-threads) it allocates whole cores:
"the count of CPUs allocated to a job is rounded up to account for every CPU on an allocated
core" (slurm.conf(5)). ``--cpus-per-task=25`` on 2-thread cores therefore takes 13 cores, and 5
such tasks 65 cores of a 64-core node, which the step cannot get. So each task gets
floor(cores / tasks) whole cores, that many times the threads a core in CPUs; with fewer cores
than tasks, 0: no binding (the job script then keeps cores for the agent by ``--agent-cores``).
"""
from __future__ import annotations

import argparse
import sys

from rudder.prefetch.policies import POLICIES


def cpus_per_task(cpus: int, threads_per_core: int, tasks_per_node: int) -> int:
    """CPUs (hardware threads) a task, in whole cores, such that the node's tasks fit its cores."""
    threads = max(1, threads_per_core)
    return (cpus // threads) // max(1, tasks_per_node) * threads


def launch_plan(policy: str, trainers_per_node: int, cpus: int, threads_per_core: int) -> dict[str, int]:
    if policy not in POLICIES:
        raise ValueError(f"RUDDER_POLICY={policy}: not a registered policy (one of {', '.join(sorted(POLICIES))})")
    if trainers_per_node < 1:
        raise ValueError(f"RUDDER_TRAINERS_PER_NODE={trainers_per_node}: at least 1")
    agents = int(POLICIES[policy].needs_agent)
    tasks = trainers_per_node + agents
    return {"agents": agents, "tasks_per_node": tasks, "cpus_per_task": cpus_per_task(cpus, threads_per_core, tasks)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.train.launch", description=__doc__.splitlines()[0])
    ap.add_argument("--policy", required=True)
    ap.add_argument("--trainers-per-node", type=int, required=True)
    ap.add_argument("--cpus", type=int, required=True, help="CPUs (hardware threads) of the node in the allocation")
    ap.add_argument("--threads-per-core", type=int, default=1)
    args = ap.parse_args(argv)
    try:
        plan = launch_plan(args.policy, args.trainers_per_node, args.cpus, args.threads_per_core)
    except ValueError as e:
        print(f"rudder-job: {e}", file=sys.stderr)
        return 2
    print(" ".join(f"{k}={v}" for k, v in plan.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
