"""Belady MIN replay: equals an exhaustive search over buffer contents on small random traces,
and is never beaten by the lookahead buffer replaying the same trace."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rudder.analysis.bound import belady_min
from rudder.prefetch.window_buffer import WindowBuffer


def optimum(trace, admissible, capacity):
    """Fewest fetches over every choice of kept rows after every minibatch (tiny traces only)."""
    best = {frozenset(): 0}
    for ids in trace:
        nxt = {}
        for held, cost in best.items():
            paid = cost + len(set(ids) - held)
            pool = sorted((held | set(ids)) & admissible)
            for r in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, r):
                    key = frozenset(keep)
                    nxt[key] = min(nxt.get(key, 1 << 30), paid)
        best = nxt
    return min(best.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), unique=True, max_size=4), min_size=1, max_size=6),
       st.integers(0, 3), st.sets(st.integers(0, 6), min_size=1))
def test_min_is_optimal(trace, capacity, admissible):
    arrays = [np.array(t, dtype=np.int64) for t in trace]
    got = belady_min(arrays, np.array(sorted(admissible), dtype=np.int64), capacity)["rows"]
    assert got == optimum(trace, admissible, capacity)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), unique=True, max_size=12), min_size=1, max_size=25),
       st.integers(1, 8), st.integers(1, 6))
def test_lookahead_never_beats_min_and_whole_run_window_equals_it(trace, capacity, window):
    arrays = [np.array(t, dtype=np.int64) for t in trace]
    halo = np.arange(0, 31)

    def lookahead(w):
        buf = WindowBuffer(capacity, halo, owned=(100, 200), num_nodes=1000, dim=1, scope="halo")
        fetched = 0
        for b, ids in enumerate(arrays):
            look = buf.lookup(ids)
            fetched += ids.size - look.hits
            buf.settle(look, None, None, ids.astype(np.float32)[:, None], arrays[b + 1:b + 1 + w])
        return fetched

    best = belady_min(arrays, halo, capacity)["rows"]
    assert lookahead(window) >= best
    assert lookahead(len(arrays)) == best
