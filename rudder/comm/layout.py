"""The MPI layout of a run: who is a trainer, who is an agent, which partition each trainer
serves, and how many threads each rank may use. Decided once, collectively, before any work.

    world ─┬─ node (Split_type SHARED: the ranks of one host)
           ├─ trainers (every trainer rank of the job)
           └─ node_trainers (the trainer ranks of this host)

With an agent per node (LLM/heuristic/classifier policies), the highest rank of each node is
its agent and every other rank trains. Partitions map onto trainers in one of two ways:

* ``trainer``: one partition per trainer rank (partition p = trainer rank p);
* ``node``: one partition per node, shared by that node's trainers through shared memory,
  which split its training nodes (the paper's setup: num_parts = number of nodes).

Every rank reaches the same verdict from collective results, so a bad combination raises
the same one-line LayoutError on all ranks instead of leaving some of them in a collective.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from rudder.comm import gate, waiting

PARTITION_MODES = ("trainer", "node")


class LayoutError(Exception):
    """Partitions, ranks and nodes that do not fit together (one line, raised on every rank)."""


@dataclass
class Layout:
    world: object  # mpi4py communicators (typed loosely so this imports without MPI)
    node: object
    trainers: object | None  # None on agent ranks
    node_trainers: object | None
    node_id: int
    num_nodes: int
    is_agent: bool
    partition_mode: str
    partition_id: int | None  # None on agent ranks
    num_parts: int
    num_trainers: int
    threads_per_rank: int
    hostname: str
    cpus: list[int] = field(default_factory=list)  # this rank's CPU affinity after start-up
    mpi_wait: str = "spin"  # how its threads wait for MPI (rudder.comm.waiting): spin or yield
    shares_cores: bool = True  # a rank of the other role (trainer or agent) on this host may run on its cores
    # world ranks of the job's agents: with them a trainer rank's log file is found without
    # opening the others (rudder.logs.reader.trainer_log_path)
    agent_ranks: list[int] = field(default_factory=list)
    # ranks of this host that may run on this rank's cores, per core (4 ranks sharing 2 cores: 2;
    # srun binding 16 cores to each: 1/16); sets how often a progress thread wakes (rudder.comm.progress)
    ranks_per_core: float = 1.0
    # ranks, in ``trainers``, of this host's trainers (the segments a window may map: MPI shares
    # memory only among them), so that opening a window asks its node, not all P ranks
    node_trainer_ranks: list[int] = field(default_factory=list)

    @property
    def trainer_rank(self) -> int:
        return self.trainers.rank if self.trainers is not None else -1

    def describe(self) -> dict:
        """What the run log records about this rank's place in the job."""
        return {"world_rank": self.world.rank, "world_size": self.world.size, "hostname": self.hostname,
                "node_id": self.node_id, "num_nodes": self.num_nodes, "node_rank": self.node.rank,
                "node_size": self.node.size, "is_agent": self.is_agent, "trainer_rank": self.trainer_rank,
                "partition_mode": self.partition_mode, "partition_id": -1 if self.partition_id is None else self.partition_id,
                "num_parts": self.num_parts, "num_trainers": self.num_trainers,
                "threads_per_rank": self.threads_per_rank, "cpus": self.cpus, "mpi_wait": self.mpi_wait,
                "shares_cores": self.shares_cores, "agent_ranks": self.agent_ranks,
                "ranks_per_core": self.ranks_per_core}


def cores_available() -> int:
    """Cores this rank may run on: its CPU affinity (what srun --cpu-bind gives it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def exposer_table(layout: Layout, num_parts: int):
    """Trainer rank holding each partition's data: partition p's trainer in ``trainer`` mode,
    the lowest trainer of the node in ``node`` mode (collective over the trainers)."""
    import numpy as np

    exposes = layout.partition_mode == "trainer" or layout.node_trainers.rank == 0
    exposer = np.full(num_parts, -1, dtype=np.int64)
    parts = gate.collective(layout.trainers, layout.trainers.allgather, layout.partition_id if exposes else -1)
    for rank, part in enumerate(parts):
        if part >= 0:
            exposer[part] = rank
    return exposer


def split_cores(allowed: list[int], agent_cores: int, is_agent: bool) -> list[int]:
    """The cores a rank keeps when ``agent_cores`` of the cores its host's ranks share are kept
    for agent ranks: the last ones for agents, the rest for trainers (all of them if too few)."""
    if agent_cores <= 0 or len(allowed) <= agent_cores:
        return allowed
    return allowed[-agent_cores:] if is_agent else allowed[:-agent_cores]


def build_layout(num_parts: int, *, agent_per_node: bool = False, partition_mode: str = "trainer",
                 agent_cores: int = 0, mpi_wait: str = "auto", comm=None) -> Layout:
    from mpi4py import MPI

    world = comm if comm is not None else MPI.COMM_WORLD
    if partition_mode not in PARTITION_MODES:
        raise LayoutError(f"--partition-mode {partition_mode}: expected one of {', '.join(PARTITION_MODES)}")
    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.rank)
    leader = node.bcast(world.rank, root=0)
    leaders = sorted({r for r in world.allgather(leader)})
    node_id, num_nodes = leaders.index(leader), len(leaders)

    smallest_node = world.allreduce(node.size, op=MPI.MIN)
    if agent_per_node and smallest_node < 2:
        raise LayoutError(f"an agent rank per node needs at least 2 ranks on every node (1 agent + trainers), "
                          f"but a node has {smallest_node}; launch more ranks per node")
    is_agent = agent_per_node and node.rank == node.size - 1
    color = MPI.UNDEFINED if is_agent else 0
    trainers = world.Split(color, key=world.rank)
    node_trainers = node.Split(color, key=node.rank)
    num_trainers = world.allreduce(0 if is_agent else 1)

    who = f"{world.size} ranks on {num_nodes} node(s)" + (f", {num_nodes} of them agents" if agent_per_node else "")
    if partition_mode == "trainer" and num_parts != num_trainers:
        raise LayoutError(f"--data holds {num_parts} partitions but the job has {num_trainers} trainer ranks ({who}); "
                          f"launch {num_parts + (num_nodes if agent_per_node else 0)} ranks, or repartition with "
                          f"--num-parts {num_trainers}")
    if partition_mode == "node" and num_parts != num_nodes:
        raise LayoutError(f"--data holds {num_parts} partitions but --partition-mode node needs one per node and the job "
                          f"spans {num_nodes} node(s) ({who}); repartition with --num-parts {num_nodes}")

    partition_id = None
    if not is_agent:
        partition_id = trainers.rank if partition_mode == "trainer" else node_id
    # Oversubscribed ranks each starting one thread per core thrash; share the host's cores
    # instead. Count ranks per host by name, not by the shared-memory communicator, which MPI
    # may split finer than the host (e.g. MPIR_CVAR_NUM_CLIQUES emulating several nodes).
    # With --agent-cores the agents get cores of their own (an LLM beside busy trainers costs
    # them a third of their speed: platform notes) and the trainers share the rest. Only where
    # the host's ranks share one set of cores (mpiexec): srun --cpu-bind has already given each
    # rank its own, and they are left alone.
    hostname = socket.gethostname()
    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    peers = world.allgather((hostname, is_agent, mine))
    on_host = [p for p in peers if p[0] == hostname]
    shared = all(p[2] == mine for p in on_host)

    def cores_of(cores: list[int], agent: bool) -> list[int]:  # a rank's cores after the split
        return split_cores(cores, agent_cores, agent) if shared else cores

    cpus = cores_of(mine, is_agent)
    if cpus != mine:
        os.sched_setaffinity(0, cpus)
    # Each peer's cores by the same rule: a rank whose cores no rank of the other role has (an
    # agent kept apart by --agent-cores or by srun's binding) disturbs no one
    others = [set(cores_of(p[2], p[1])) for p in on_host if p[1] != is_agent]
    shares_cores = not cpus or any(not o or o & set(cpus) for o in others)
    if agent_cores and shared:  # share among the ranks of the same kind on this host
        threads = max(1, len(cpus) // sum(p[1] == is_agent for p in on_host))
    else:
        threads = max(1, min(cores_available(), (os.cpu_count() or 1) // len(on_host)))
    sharing = sum(1 for p in on_host if not cpus or not p[2] or set(cores_of(p[2], p[1])) & set(cpus))
    if is_agent:  # Split with UNDEFINED hands agents COMM_NULL
        trainers = node_trainers = None
        near = []
    else:
        node_group, trainer_group = node_trainers.Get_group(), trainers.Get_group()
        near = [int(r) for r in node_group.Translate_ranks(list(range(node_trainers.size)), trainer_group)]
        node_group.Free()
        trainer_group.Free()
    return Layout(world, node, trainers, node_trainers, node_id, num_nodes, is_agent, partition_mode, partition_id,
                  num_parts, num_trainers, threads, hostname, cpus, waiting.resolve(mpi_wait, threads), shares_cores,
                  [rank for rank, p in enumerate(peers) if p[1]], sharing / max(1, len(cpus)), near)
