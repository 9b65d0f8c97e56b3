"""The simulated transport: every partition's CSR in one process instead of RMA windows, and
reads counted (and priced by the machine model) instead of moved. Each class stands in for the
run path's own behind the same interface: ``SimulatedAdjacency`` for ``rudder.data.adjacency.Adjacency``,
``CountedStore`` for ``rudder.data.feature_store.FeatureStore``, ``ModelledLink`` for
``rudder.agent.link.AgentLink``, ``MemoryLog`` for ``rudder.logs.writer.RunLog``."""
from __future__ import annotations

import numpy as np

from rudder.agent.protocol import DecisionLink
from rudder.agent.service import DecisionService
from rudder.comm.dist_array import RUNS_MIN_ROW_BYTES, ReadStats
from rudder.data.partition_store import PartitionMeta, global_csr, read_partition
from rudder.sim.machine import Machine


class Graph:
    """Every partition's CSR in one process, and what a trainer needs of its own partition."""

    def __init__(self, data: str):
        self.meta = PartitionMeta.load(data)
        self.offsets = np.asarray(self.meta.offsets, dtype=np.int64)
        self.parts = [read_partition(data, p, self.meta) for p in range(self.meta.num_parts)]
        self.indptr, self.indices = global_csr(self.parts)


class SimulatedReads:
    """Counts reads as a trainer of partition ``part`` would do them, and prices what does not
    depend on other trainers or on the pipeline: rows of the trainer's own partition are local,
    of a partition on the same node shared (at the on-node bandwidth), of any other remote, each
    Get call costing the machine's call cost. ``seconds_remote`` holds that price; ``rounds``
    counts the reads with off-node rows (a round trip each, priced by ``rudder.sim.timing``, as
    are the off-node bytes, ``bytes_remote``: trainers share links there)."""

    def __init__(self, graph: Graph, part: int, machine: Machine | None, row_bytes: int):
        self.graph, self.part, self.machine, self.row_bytes = graph, part, machine, row_bytes
        per_node = machine.ranks_per_node if machine else 1
        self.node_of = np.arange(graph.meta.num_parts) // per_node
        self.rounds = 0

    def count(self, owners: np.ndarray, row_bytes: int, ids: np.ndarray | None = None,
              positions: np.ndarray | None = None) -> ReadStats:
        """``ids``/``positions`` (rows read one Get per run, ``rudder.comm.dist_array``): count
        those runs as calls; else one indexed Get per owner."""
        other = owners != self.part
        same_node = other & (self.node_of[owners] == self.node_of[self.part])
        off = other & ~same_node
        s = ReadStats(rows_local=int((~other).sum()), rows_shared=int(same_node.sum()), rows_remote=int(off.sum()))
        s.bytes_remote = s.rows_remote * row_bytes
        s.owners_touched = int(np.unique(owners[off]).size)
        self.rounds += s.owners_touched > 0
        if self.machine is not None:
            m = self.machine
            calls = s.owners_touched if ids is None else get_runs(owners[off], ids[off], positions[off])
            s.seconds_remote = calls * m.get_call + s.rows_shared * row_bytes / m.node_bandwidth
        return s


def get_runs(owners: np.ndarray, ids: np.ndarray, positions: np.ndarray) -> int:
    """Gets of a read by runs: rows consecutive in both the owner's segment and the output, per owner."""
    if owners.size == 0:
        return 0
    order = np.argsort(owners, kind="stable")
    o, g, p = owners[order], ids[order], positions[order]
    return 1 + int(((np.diff(o) != 0) | (np.diff(g) != 1) | (np.diff(p) != 1)).sum())


class SimulatedAdjacency(SimulatedReads):
    """``rudder.data.adjacency.Adjacency`` over the in-memory CSR: the same degrees and
    neighbours; ``replicated`` (``ReplicatedAdjacency``): every read is local."""

    def __init__(self, graph: Graph, part: int, machine: Machine | None, row_bytes: int, replicated: bool = False):
        super().__init__(graph, part, machine, row_bytes)
        self.replicated = replicated

    def counted(self, owners: np.ndarray) -> ReadStats:
        return ReadStats(rows_local=owners.size) if self.replicated else self.count(owners, 8)

    def rows(self, gids: np.ndarray, stats: ReadStats):
        owners = self.graph.meta.owner_of(gids)
        start = self.graph.indptr[gids]
        stats.add(self.counted(np.concatenate([owners, owners])))  # indptr[g] and indptr[g + 1]
        return owners, start, self.graph.indptr[gids + 1] - start

    def neighbours(self, parts: np.ndarray, positions: np.ndarray, stats: ReadStats) -> np.ndarray:
        stats.add(self.counted(parts))
        return self.graph.indices[positions]


class CountedStore(SimulatedReads):
    """``rudder.data.feature_store.FeatureStore`` with rows of width 0: what a gather would read."""
    dim = 0

    def __init__(self, graph: Graph, part: int, machine: Machine | None, row_bytes: int, gets: str = "auto"):
        super().__init__(graph, part, machine, row_bytes)
        self.runs = gets == "runs" or (gets == "auto" and row_bytes >= RUNS_MIN_ROW_BYTES)

    def in_shared_memory(self, ids: np.ndarray) -> np.ndarray:
        """No row is worth leaving to the store: rows here are 0 wide."""
        return np.zeros(np.asarray(ids).size, dtype=bool)

    def gather(self, ids: np.ndarray, out: np.ndarray | None = None, at: np.ndarray | None = None, spare: bool = False,
               while_fetching=None):
        ids = np.asarray(ids, dtype=np.int64)
        rows = out if out is not None else np.empty((ids.size, 0), np.float32)
        positions = (np.arange(ids.size) if at is None else np.asarray(at)) if self.runs else None
        if while_fetching is not None:
            while_fetching()
        return rows, self.count(self.graph.meta.owner_of(ids), self.row_bytes, ids if self.runs else None, positions)


class MemoryLog:
    """The rows a policy or the decision service would log, kept in memory."""

    def __init__(self):
        self.tables: dict[str, list] = {}

    def append(self, name: str, row) -> None:
        self.tables.setdefault(name, []).append(row)

    def append_ragged(self, name: str, values: np.ndarray) -> None:
        self.append(name, values)

    def maybe_flush(self) -> None:
        pass


class ModelledLink(DecisionLink):
    """A trainer's agent link answered in-process: the answer to a request sent after minibatch
    c is applied on minibatch c + latency (``DecisionLink``'s fixed latency, which a real run
    with ``--agent-latency`` follows too)."""

    def __init__(self, service: DecisionService, trainer: int, facts: dict, window: int, latency: int,
                 aligned: bool = False):
        """``aligned``: windows at agreed minibatches, as the collective transport asks."""
        if latency < 1:
            raise ValueError(f"--agent-latency {latency}: the simulator needs a positive number of minibatches")
        super().__init__(window, latency, aligned)
        self.service, self.trainer, self.answer = service, trainer, None
        service.hello(trainer, facts)

    def _post(self, request: dict) -> None:
        self.answer = self.service.answer(self.trainer, request)

    def _wait(self) -> np.ndarray:
        return self.answer
