"""``python -m partitioning --plan``: the predicted peak memory, disk and time of a run, before it.

The sizes come from the spec without reading the graph (synthetic parameters, the headers of
``.npz``/``.npy`` arrays, an edge list's size), or from ``--like``. The model adds up what each
phase holds (``phase_bytes``), in the pipeline's own array types; METIS's internal memory and the
time rates are fitted to this host's measured runs (docs/partitioning.md, bench/partition_memory.py).

    N nodes, M directed edges entering the CSR buffer (both directions of every input edge),
    E = kept directed edges (M less duplicates: RMAT keeps ~0.94 of M, files are assumed to keep all),
    D feature columns (float32 on input), K parts, I = 4 bytes a node ID (8 from 2^31 nodes).
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass

import numpy as np

from partitioning.graph import InputError
from partitioning.metis import check_levels, metis_spill_bytes, metis_spills
from partitioning.multilevel import CLUSTER_SHARE
from partitioning.spec import Options, parse_options, positional

# Fitted on this host (docs/partitioning.md, "The memory model"): METIS 5.2 with DROPEDGES and
# three constraints, bytes beyond its input arrays, by where it keeps its coarse levels
# (``--metis-levels``). In memory it keeps every level until it refines back, about 8.4 bytes a
# coarse edge, and how many coarse edges a graph's levels sum to is not in its counts (3.9x the
# edges on RMAT-20, 33 bytes an edge; 5.6x on RMAT-21, 47): the plan budgets the slow rate (fitted
# on RMAT-21 and RMAT-22) and prints the peak at the fast one (RMAT-18, 29) beside it. On disk it
# holds the levels it works on and those under METIS's 128 MB spill threshold: 11 bytes an edge,
# fitted on RMAT-20 to RMAT-23 (1.08-0.94 of their peaks).
METIS_BYTES_PER_EDGE = {"memory": 46.0, "disk": 11.0}
METIS_BYTES_PER_EDGE_FAST = 29.0
METIS_BYTES_PER_NODE = 150.0
# The multilevel path (partitioning/multilevel.py): METIS on at most a quarter of the edges, each
# coarse graph on scratch disk between its uses, so besides the input CSR it holds the larger of
# METIS on the coarsest graph (METIS's own arrays and that graph's, per edge METIS sees: with its
# levels in memory 48 and 47 on RMAT-20 and RMAT-22 into 8 parts, on disk 40.5 fitted on RMAT-22
# and RMAT-23 into 64; it spills nothing below its threshold) and one coarse level in memory (the first, the
# largest: 0.78-0.83 of the edges on RMAT-22 and RMAT-23), and one 1M-edge chunk's temporaries.
# Coarse levels take 8 bytes an edge (12 where a summed weight may pass 2^31: int64) and 32 a node
# on disk; over all levels 1.1x the edges on RMAT-18 into 8 parts, 3.2x on RMAT-23 into 64 (a
# cluster holds at most 1/(4k) of a constraint: more parts, more levels); the larger is budgeted.
MULTILEVEL_TOP_SHARE = 0.25
MULTILEVEL_TOP_BYTES_PER_EDGE = {"memory": 50.0, "disk": 40.5}
MULTILEVEL_FIRST_LEVEL_SHARE = 0.85
MULTILEVEL_LEVELS_EDGES, MULTILEVEL_LEVELS_NODES = 3.3, 3.3
MULTILEVEL_CHUNK_BYTES = 100 << 20
MULTILEVEL_SECONDS_PER_EDGE = 1.9e-6
METIS_EDGE_LIMIT = 2**31 - 1
BASELINE_BYTES = 84 << 20
MEMORY_PHASES = ("generate", "csr", "assign", "write")  # one after another: the peak is the largest
CHUNK_TEMP_BYTES = 4 * (1 << 22) * 12  # the CSR builder's temporaries for one 4M-edge chunk
BLOCK_BYTES = 1 << 26
RMAT_KEPT = 0.94
# CPU seconds per unit on this host (one core of two), from RMAT-20's run: a rough guide (the
# host was shared when it was measured; docs/partitioning.md)
SECONDS = {"generate_per_edge": 7.2e-7, "csr_per_edge": 3.6e-7, "metis_per_edge": 8.5e-7, "metis_disk_per_edge": 1.7e-6,
           "write_per_edge": 2.5e-7, "write_per_feature_byte": 1.0e-8}


@dataclass
class GraphSize:
    name: str
    nodes: int
    directed_edges: int  # M: entering the CSR buffer
    kept_fraction: float  # E / M
    feat_dim: int
    classes: int
    generated: bool  # the synthetic generator: its edges and label votes are held while loading
    archive: bool = False  # an OGB data.npz, whose members need scratch space when compressed


PRESETS = {
    # ogbn-papers100M: 111,059,956 nodes, 1,615,685,872 edges (both directions added), 128 float32 features, 172 classes
    "papers100M": GraphSize("ogbn-papers100M", 111_059_956, 2 * 1_615_685_872, 1.0, 128, 172, False, True),
    # ogbn-products: 2,449,029 nodes, 61,859,140 undirected edges, 100 features, 47 classes
    "products": GraphSize("ogbn-products", 2_449_029, 2 * 61_859_140, 1.0, 100, 47, False),
}


def _npy_shape(path: str, key: str) -> tuple[int, ...]:
    with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
        version = np.lib.format.read_magic(f)
        reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        return reader(f)[0]


def size_of_spec(spec: str) -> GraphSize:
    kind, _, rest = spec.partition(":")
    if kind == "synthetic":
        gen, _, optext = rest.partition(":")
        opts = Options(parse_options(optext, spec), spec, set(parse_options(optext, spec)))
        if gen == "rmat":
            scale, factor = opts.int("scale", 10), opts.int("edge_factor", 16)
            return GraphSize(f"rmat-s{scale}", 1 << scale, 2 * (factor << scale), RMAT_KEPT if opts.symmetric else 0.97,
                             opts.int("feat_dim", 64), opts.int("classes", 8), True)
        if gen == "sbm":
            n = opts.int("nodes", 10000)
            return GraphSize(f"sbm-n{n}", n, 2 * int(n * opts.float("avg_degree", 10.0) / 2), 1.0,
                             opts.int("feat_dim", 32), opts.int("blocks", 8), False)
    if kind == "ogb":
        (root, name), _ = positional(rest, spec, 2, "ogb:DIR:NAME")
        data = next((os.path.join(d, "raw", "data.npz") for d in (os.path.join(root, name.replace("-", "_")),
                                                                   os.path.join(root, name), root)
                     if os.path.isfile(os.path.join(d, "raw", "data.npz"))), None)
        if data:
            edges, feats = _npy_shape(data, "edge_index"), _npy_shape(data, "node_feat")
            return GraphSize(name, feats[0], 2 * edges[1], 1.0, feats[1], 0, False, True)
    if kind == "edgelist":
        path = rest.partition(",")[0]
        if os.path.isfile(path):
            with open(path, "rb") as f:
                sample = f.read(1 << 20)
            lines = max(1, sample.count(b"\n"))
            edges = int(os.path.getsize(path) / (len(sample) / lines))
            top = max(int(x) for x in sample.replace(b",", b" ").split() if x.isdigit()) + 1
            return GraphSize(os.path.basename(path), top, 2 * edges, 1.0, 2, 1, False)
    raise InputError("--plan", f"sizes of '{spec}' are not known without loading it: give --like, or a synthetic, "
                               "ogb (data.npz) or edgelist spec")


def assign_method(method: str, edges: float) -> str:
    """The method a run takes: auto is METIS up to its index limit, the multilevel path beyond."""
    return ("metis" if edges <= METIS_EDGE_LIMIT else "multilevel") if method == "auto" else method


def level_edge_bytes(e: float, n: float, parts: int) -> int:
    """Bytes a coarse edge takes: an int32 neighbour, and its summed weight, in int32 where no
    cluster's degree can pass 2^31 (``multilevel.contract`` checks it on the real clusters): a
    cluster's degree is capped at 1/(CLUSTER_SHARE k) of the edges, or one node's (below n)."""
    return 8 if max(e / (CLUSTER_SHARE * parts), n) <= METIS_EDGE_LIMIT else 12


def multilevel_metis_graph(e: float, n: float) -> tuple[float, float]:
    """(edges, nodes) of the graph the multilevel path hands METIS: a quarter of the edges at most,
    its nodes taken at the input's edges a node."""
    seen = MULTILEVEL_TOP_SHARE * e
    return seen, seen / (e / n)


def metis_levels_bytes(edges: float, nodes: float, metis_levels: str, fast: bool = False) -> float:
    """METIS's own bytes a directed edge it sees: its levels on disk where it spills them, else in
    memory (the slow coarsening budgeted, or the ``fast`` one)."""
    if metis_spills(edges, nodes, metis_levels):
        return METIS_BYTES_PER_EDGE["disk"]
    return METIS_BYTES_PER_EDGE_FAST if fast else METIS_BYTES_PER_EDGE["memory"]


def phase_bytes(g: GraphSize, parts: int, method: str = "auto", metis_levels: str = "disk", fast: bool = False
                ) -> dict[str, float]:
    """Bytes each phase holds beyond the interpreter (the model; see the module docstring), with
    METIS's levels where ``metis_levels`` says (``fast``: in memory, the fast coarsening's)."""
    n, m, d = g.nodes, g.directed_edges, g.feat_dim
    e = m * g.kept_fraction
    i = 4 if n < 2**31 else 8
    node_data = 8 * n + 3 * n  # labels, masks
    # generator: its edges as int32 pairs, the label votes (two N x C float64), degree arrays
    generate = (8 * m / 2 + 16 * n * max(g.classes, 1) + 40 * n) if g.generated else 0
    held_input = 8 * m / 2 if g.generated else 0
    csr = held_input + node_data + i * m + 16 * n + CHUNK_TEMP_BYTES  # buffer of every edge in, counts, cursors
    # METIS: the CSR as its adjncy, int32 xadj and three weights a node, and its own arrays
    assign = node_data + i * e + 8 * n + (4 + 12) * n + metis_levels_bytes(e, n, metis_levels, fast) * e \
        + METIS_BYTES_PER_NODE * n
    if assign_method(method, e) == "multilevel":
        # the CSR, its xadj (as METIS takes it, and in int64), the balance weights (as METIS takes
        # them, and in int64) and every level's cluster map
        held = node_data + i * e + (4 + 8) * n + (12 + 24) * n + 8 * (1 + MULTILEVEL_LEVELS_NODES) * n
        seen, seen_nodes = multilevel_metis_graph(e, n)  # METIS on the coarsest graph
        spills = metis_spills(seen, seen_nodes, metis_levels)
        top = MULTILEVEL_TOP_BYTES_PER_EDGE["disk" if spills else "memory"] * seen
        first_level = level_edge_bytes(e, n, parts) * MULTILEVEL_FIRST_LEVEL_SHARE * e + 32 * n
        assign = held + max(top, first_level) + MULTILEVEL_CHUNK_BYTES
    elif method == "random":  # a permutation and the parts: arrays per node only
        assign = node_data + i * e + 8 * n + 24 * n
    e_part, n_part = e / parts, n / parts
    part_features = 4 * d * n_part
    # a part: its rows' positions, sources, sort keys and hash rows (8 + 4 + 8 + 8 bytes an edge), its file
    # built in memory and that image's bytes (the CSR twice, the features twice), and its float32 rows
    part = 44 * e_part + 100 * n_part + 3 * part_features + BLOCK_BYTES
    per_node = (8 + 4 + 8) * n  # orig_of_new, new_of_orig, in-degree by new ID
    write = node_data + i * e + 8 * n + per_node + part
    return {"generate": generate, "csr": csr, "assign": assign, "write": write, "part_features": part_features,
            "edges": e, "other_rank": (4 + 8) * n + part}


def plan(g: GraphSize, parts: int, ranks: int = 1, method: str = "auto", metis_levels: str = "disk") -> dict:
    check_levels(metis_levels)
    phases = phase_bytes(g, parts, method, metis_levels)
    peak_phase = max(MEMORY_PHASES, key=phases.get)
    peak = BASELINE_BYTES + phases[peak_phase]
    fast = phase_bytes(g, parts, method, metis_levels, fast=True)
    peak_fast = BASELINE_BYTES + max(fast[name] for name in MEMORY_PHASES)
    n, m, d, e = g.nodes, g.directed_edges, g.feat_dim, phases["edges"]
    disk = 4 * d * n + 8 * e + 60 * n + 4096 * parts  # float32 features (compact types: less), CSR, node data
    scratch = 4 * d * n if g.generated else 0
    if g.archive:  # a compressed data.npz: edges and features decompressed to scratch (none if stored)
        scratch = 8 * m + 4 * d * n
    ran = assign_method(method, e)
    levels = 0.0
    if ran == "multilevel":  # the coarse levels, in the scratch directory, and METIS's on the coarsest graph
        levels = level_edge_bytes(e, n, parts) * MULTILEVEL_LEVELS_EDGES * e + 32 * MULTILEVEL_LEVELS_NODES * n \
            + metis_spill_bytes(*multilevel_metis_graph(e, n), metis_levels)
    elif ran == "metis":
        levels = metis_spill_bytes(e, n, metis_levels)
    metis_rate = SECONDS["metis_disk_per_edge" if metis_spills(e, n, metis_levels) else "metis_per_edge"]
    seconds = {"generate": SECONDS["generate_per_edge"] * m / 2 if g.generated else 0.0,
               "csr": SECONDS["csr_per_edge"] * m,
               "assign": {"metis": metis_rate, "multilevel": MULTILEVEL_SECONDS_PER_EDGE, "random": 0.0}[ran] * e,
               "write": (SECONDS["write_per_edge"] * e + SECONDS["write_per_feature_byte"] * 4 * d * n) / ranks}
    return {"graph": g, "parts": parts, "ranks": ranks, "method": method, "metis_levels": metis_levels,
            "phases": phases, "peak_phase": peak_phase,
            "peak_bytes": peak, "peak_bytes_fast_coarsening": peak_fast,
            "other_rank_bytes": BASELINE_BYTES + phases["other_rank"],
            "bytes_per_edge": (peak - BASELINE_BYTES - phases["part_features"]) / e, "disk_bytes": disk,
            "scratch_bytes": scratch + levels, "levels_scratch_bytes": levels, "seconds": seconds,
            "total_seconds": sum(seconds.values())}


def plan_for(spec_or_name: str, parts: int, ranks: int = 1, like: bool = False, method: str = "auto",
             metis_levels: str = "disk") -> dict:
    if parts < 1 or ranks < 1:
        raise InputError("--num-parts", f"{parts} parts on {ranks} ranks: both must be >= 1")
    return plan(PRESETS[spec_or_name] if like else size_of_spec(spec_or_name), parts, ranks, method, metis_levels)


def format_plan(p: dict) -> str:
    g, gib = p["graph"], 2**30
    method = {"metis": "METIS", "random": "random", "multilevel": "the multilevel path"}[
        assign_method(p["method"], p["phases"]["edges"])]
    lines = [f"plan for {g.name}: {g.nodes} nodes, {g.directed_edges} directed edges in ({p['phases']['edges']:.0f} kept), "
             f"{g.feat_dim} features, {p['parts']} parts, {p['ranks']} rank(s)",
             f"predicted peak memory {p['peak_bytes'] / gib:.2f} GiB (rank 0, in the {p['peak_phase']} phase; "
             f"{p['bytes_per_edge']:.1f} bytes a directed edge beside one part's features)"
             + (f"; other ranks {p['other_rank_bytes'] / gib:.2f} GiB" if p["ranks"] > 1 else "")
             + (f"; METIS keeps every coarse level, so a graph that coarsens fast needs less: "
                f"{p['peak_bytes_fast_coarsening'] / gib:.2f} GiB at the least measured rate (docs/partitioning.md)"
                if p["peak_bytes_fast_coarsening"] < p["peak_bytes"] else ""),
             f"  {'phase':<9} {'memory':>12} {'time':>8}"]
    lines += [f"  {name:<9} {p['phases'][name] / gib:8.2f} GiB {p['seconds'][name]:8.0f} s"
              for name in MEMORY_PHASES]
    lines.append(f"  (assign: {method}; write: shared by {p['ranks']} rank(s))")
    lines.append(f"predicted disk {p['disk_bytes'] / gib:.2f} GiB of partitions (float32 features; compact types "
                 f"less), scratch {(p['scratch_bytes'] - p['levels_scratch_bytes']) / gib:.2f} GiB"
                 + (" if data.npz is compressed (0 if stored)" if g.archive else "")
                 + (f" + {p['levels_scratch_bytes'] / gib:.2f} GiB of coarse levels"
                    + (" (METIS's, --metis-levels disk)" if method == "METIS" else "") if p["levels_scratch_bytes"] else ""))
    lines.append(f"predicted time {p['total_seconds']:.0f} s at this host's rates (2 cores; docs/partitioning.md)")
    return "\n".join(lines)
