"""The per-node choice of DGL's uniform sampling without replacement: exact counts, distinct
positions, and uniform frequencies (binomial bounds), in all three regimes of degree."""
from __future__ import annotations

import numpy as np

from rudder.sampling.neighbors import sample_positions, with_new_nodes


def test_counts_and_distinct_positions():
    rng = np.random.default_rng(0)
    degrees = np.array([0, 1, 3, 5, 6, 11, 20, 21, 1000, 7, 0, 100000])
    rows, pos = sample_positions(degrees, 5, rng)
    assert np.all(np.diff(rows) >= 0)
    counts = np.bincount(rows, minlength=degrees.size)
    np.testing.assert_array_equal(counts, np.minimum(degrees, 5))
    for r in range(degrees.size):
        p = pos[rows == r]
        assert len(set(p.tolist())) == p.size and (p >= 0).all() and (p < degrees[r]).all()
    assert sorted(pos[rows == 2].tolist()) == [0, 1, 2]  # degree <= fanout: all of them


def test_uniform_frequencies():
    """Each position of a degree-d row is chosen with probability k/d; counts over T trials stay
    within 5 standard deviations (a false alarm is ~1e-6 per position)."""
    rng = np.random.default_rng(1)
    k, trials = 4, 4000
    degrees = np.array([9, 16, 50])  # the random-key regime (<= 4k) and the redraw regime
    hits = [np.zeros(d) for d in degrees]
    for _ in range(trials):
        rows, pos = sample_positions(degrees, k, rng)
        for r in range(degrees.size):
            hits[r][pos[rows == r]] += 1
    for d, h in zip(degrees, hits):
        p = k / d
        assert np.abs(h - trials * p).max() < 5 * np.sqrt(trials * p * (1 - p)), (d, h)


def test_block_source_order():
    src, index = with_new_nodes(np.array([7, 3]), np.array([9, 3, 9, 1, 7]))
    assert src.tolist() == [7, 3, 9, 1]  # destinations first, then new nodes by first appearance
    assert index.tolist() == [2, 1, 2, 3, 0]
