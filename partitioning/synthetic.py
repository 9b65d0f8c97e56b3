"""Seeded synthetic graphs for scale tests: Graph500 RMAT and a stochastic block model.

Both give learnable node classification: labels come from the graph's structure and features
are noisy class centroids, so a GNN's accuracy is a meaningful signal (not random labels).
Generation streams: edges in chunks into int32 arrays (8 bytes a generated edge), features in
blocks of rows into a scratch ``.npy`` file (``partitioning.features.ScratchArray``) that the
partitioner reads back part by part, so the features are never all in memory. The random
streams are those of the in-memory generator this replaced (same draws in the same order), so a
spec gives the same graph, bit for bit, as before.
"""
from __future__ import annotations

import math

import numpy as np

from partitioning.features import rows_per_block
from partitioning.graph import InputError
from partitioning.ondisk import ScratchArray
from rudder.data.feature_encoding import FeatureEncoding

RMAT_A, RMAT_B, RMAT_C = 0.57, 0.19, 0.19  # Graph500 initiator; D = 0.05
_CHUNK = 1 << 22


def class_features(labels: np.ndarray, num_classes: int, dim: int, signal: float, rng, opts, extra=None) -> np.ndarray:
    """Row i = signal * centroid[label_i] + N(0, 1) noise (float32), generated block by block into
    a scratch file (a read-only memmap of it is returned). ``extra`` (optional, [N]) is written
    into column 0, e.g. a structural feature; ``opts``' feat_round rounds every value."""
    rounding = rounding_encoding(opts, dim)
    centroids = rng.standard_normal((num_classes, dim), dtype=np.float32) * np.float32(signal)
    n = labels.shape[0]
    out = ScratchArray((n, dim), np.float32, f"the {n} x {dim} generated features")
    try:
        step = min(_CHUNK, rows_per_block(4 * dim))  # the noise is one stream: any block size draws the same
        for lo in range(0, n, step):
            hi = min(lo + step, n)
            block = rng.standard_normal((hi - lo, dim), dtype=np.float32)
            block += centroids[labels[lo:hi]]
            if extra is not None:
                block[:, 0] = extra[lo:hi]
            if rounding is not None:
                block = rounding.decode(rounding.encode(block))
            out.append(block)
        return out.finish()
    except BaseException:
        out.abandon()
        raise


ROUNDINGS = ("float16", "bfloat16")


def rounding_encoding(opts, dim: int) -> FeatureEncoding | None:
    """Option ``feat_round=float16|bfloat16``: every value rounded to the nearest one of that
    type (still float32), as features that a compact storage type holds exactly."""
    kind = opts.get("feat_round")
    if kind is None:
        return None
    if kind not in ROUNDINGS:
        raise InputError(opts.where, f"option feat_round={kind} must be one of {', '.join(ROUNDINGS)}")
    return FeatureEncoding(kind, dim)


def degrees(src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """Edges at each node (as source plus as destination), counted chunk by chunk."""
    deg = np.zeros(n, dtype=np.int64)
    for a in (src, dst):
        for lo in range(0, a.shape[0], _CHUNK):
            deg += np.bincount(a[lo:lo + _CHUNK], minlength=n)
    return deg


def smooth_labels(labels: np.ndarray, src: np.ndarray, dst: np.ndarray, classes: int, rounds: int) -> np.ndarray:
    """Rounds of neighbour voting: each node takes the class with the largest vote, its own
    label counting 1 and each neighbour u counting 1/sqrt(deg u). The degree damping keeps
    RMAT's hubs from flooding the graph with one class (plain majority voting gave 72% class 0);
    two rounds lift edge homophily from ~0.24 to ~0.8 (Cora's level) at 8 classes."""
    n = labels.shape[0]
    weight = 1.0 / np.sqrt(np.maximum(degrees(src, dst, n), 1))
    for _ in range(rounds):
        votes = np.bincount(np.arange(n) * classes + labels, minlength=n * classes).astype(np.float64)
        for a, b in ((src, dst), (dst, src)):
            for lo in range(0, a.shape[0], _CHUNK):
                ai = a[lo:lo + _CHUNK]
                votes += np.bincount(b[lo:lo + _CHUNK].astype(np.int64) * classes + labels[ai], weights=weight[ai],
                                     minlength=n * classes)
        labels = votes.reshape(n, classes).argmax(axis=1)
    return labels


def rmat(opts):
    """Graph500 Kronecker/RMAT: 2^scale vertices, edge_factor * 2^scale generated edges,
    initiator A=.57 B=C=.19 D=.05, vertex ids randomly permuted afterwards (as Graph500 does).

    Label: the top ceil(log2 C) bits of a vertex's pre-permutation id, mod C (each recursion
    level puts both endpoints on the same side with probability A + D = 0.62, so neighbours
    share these bits more often than chance), then two rounds of degree-damped neighbour voting
    (smooth_labels) that turn them into communities of the generated graph.
    Features: class centroid + noise, column 0 = standardised log(1 + degree).
    """
    scale = opts.int("scale", 10, minimum=1)
    edge_factor = opts.int("edge_factor", 16, minimum=1)
    dim = opts.int("feat_dim", 64, minimum=1)
    classes = opts.int("classes", 8, minimum=1)
    seed = opts.int("seed", 0)
    signal = opts.float("signal", 0.5, lo=0.0)
    if scale > 31:
        raise InputError(opts.where, f"option scale={scale} must be <= 31")
    n, m = 1 << scale, edge_factor << scale
    rng = np.random.default_rng(seed)
    rounding_encoding(opts, dim)  # a bad feat_round fails before the long generation
    ids = np.int32 if n - 1 <= np.iinfo(np.int32).max else np.int64
    src = np.empty(m, dtype=ids)
    dst = np.empty(m, dtype=ids)
    ab, abc = RMAT_A + RMAT_B, RMAT_A + RMAT_B + RMAT_C
    for lo in range(0, m, _CHUNK):
        hi = min(lo + _CHUNK, m)
        u = np.zeros(hi - lo, dtype=ids)
        v = np.zeros(hi - lo, dtype=ids)
        for level in range(scale):
            r = rng.random(hi - lo, dtype=np.float32)
            bit = ids(1) << (scale - 1 - level)
            u[r >= ab] |= bit  # quadrants C and D: source in the upper half
            v[((r >= RMAT_A) & (r < ab)) | (r >= abc)] |= bit  # quadrants B and D
        src[lo:hi], dst[lo:hi] = u, v
    del u, v
    class_bits = max(1, math.ceil(math.log2(classes))) if classes > 1 else 0
    labels_unpermuted = (np.arange(n, dtype=np.int64) >> max(scale - class_bits, 0)) % classes
    labels_unpermuted = smooth_labels(labels_unpermuted, src, dst, classes, rounds=2)
    perm = rng.permutation(n)  # new id of vertex i
    for a in (src, dst):  # relabelled in place, chunk by chunk
        for lo in range(0, m, _CHUNK):
            a[lo:lo + _CHUNK] = perm[a[lo:lo + _CHUNK]]
    labels = np.empty(n, dtype=np.int64)
    labels[perm] = labels_unpermuted
    del perm, labels_unpermuted
    deg = np.log1p(degrees(src, dst, n)).astype(np.float32)
    deg = (deg - deg.mean()) / max(float(deg.std()), 1e-6)
    feats = class_features(labels, classes, dim, signal, rng, opts, extra=deg)
    info = {"dataset": f"rmat-s{scale}-e{edge_factor}", "generator": "rmat", "scale": scale, "edge_factor": edge_factor,
            "initiator": [RMAT_A, RMAT_B, RMAT_C], "seed": seed, "signal": signal}
    return n, src, dst, feats, labels, classes, info


def sbm(opts):
    """Stochastic block model: ``blocks`` equal-ish blocks (labels = blocks), nodes * avg_degree / 2
    undirected edges of which a fraction ``homophily`` join two nodes of the same block;
    features are class-conditional Gaussians."""
    n = opts.int("nodes", 10000, minimum=2)
    blocks = opts.int("blocks", 8, minimum=1)
    avg_degree = opts.float("avg_degree", 10.0, lo=0.0)
    homophily = opts.float("homophily", 0.8, lo=0.0, hi=1.0)
    dim = opts.int("feat_dim", 32, minimum=1)
    seed = opts.int("seed", 0)
    signal = opts.float("signal", 0.5, lo=0.0)
    rng = np.random.default_rng(seed)
    rounding_encoding(opts, dim)
    labels = rng.permutation(np.arange(n, dtype=np.int64) % blocks)
    members = np.argsort(labels, kind="stable")  # node ids grouped by block
    starts = np.searchsorted(labels[members], np.arange(blocks + 1))
    m = int(n * avg_degree / 2)
    intra = rng.random(m) < (homophily if blocks > 1 else 1.0)
    src = rng.integers(0, n, size=m, dtype=np.int64)
    dst = np.empty(m, dtype=np.int64)
    b = labels[src[intra]]
    size = starts[b + 1] - starts[b]
    dst[intra] = members[starts[b] + (rng.random(b.size) * size).astype(np.int64)]
    inter = np.flatnonzero(~intra)
    while inter.size:  # redraw until the endpoint lies in another block
        dst[inter] = rng.integers(0, n, size=inter.size, dtype=np.int64)
        inter = inter[labels[dst[inter]] == labels[src[inter]]]
    feats = class_features(labels, blocks, dim, signal, rng, opts)
    info = {"dataset": f"sbm-n{n}-b{blocks}", "generator": "sbm", "avg_degree": avg_degree, "homophily": homophily,
            "seed": seed, "signal": signal}
    return n, src, dst, feats, labels, blocks, info


# name -> (generator, the option keys it reads)
GENERATORS = {
    "rmat": (rmat, {"scale", "edge_factor", "feat_dim", "classes", "seed", "signal", "feat_round"}),
    "sbm": (sbm, {"nodes", "blocks", "avg_degree", "homophily", "feat_dim", "seed", "signal", "feat_round"}),
}
