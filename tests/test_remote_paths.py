"""Feature-store and sampler paths that need more than one node: one host is made to look like
two to MPICH (MPIR_CVAR_NUM_CLIQUES=2), so off-node reads go through RMA Get, the node partition
mode shares a partition between a node's trainers, and agent ranks sit out."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, mpiexec

from partitioning.partition import partition_graph
from partitioning.sources import load_spec

SCRIPT = os.path.join(REPO, "tests", "mpi_scripts", "check_remote_paths.py")
SPEC = "synthetic:sbm:nodes=2000,blocks=4,avg_degree=6,feat_dim=12,seed=9"


def launch(ranks, *cases):
    """``cases``: (partition directory, mode, agent) each, checked one after another in one launch."""
    env = dict(os.environ, MPIR_CVAR_NUM_CLIQUES="2", OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    args = [str(a) for parts_dir, mode, agent in cases for a in (parts_dir, mode, "1" if agent else "0")]
    return subprocess.run([mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", SCRIPT, *args],
                          capture_output=True, text=True, timeout=120 * len(cases), env=env)


@pytest.fixture(scope="module")
def graph():
    return load_spec(SPEC)


# Each layout with features in another storage type (lossy ones here: the store must return
# exactly the stored rows widened, as read_features gives them): (parts, mode, agent, dtype). The
# 4-rank layouts are checked in one launch, one after another; 6 ranks in a launch of its own.
FOUR_RANKS = [(4, "trainer", False, "float32"), (4, "trainer", False, "uint8"), (2, "node", False, "bits"),
              (2, "trainer", True, "float16")]
SIX_RANKS = [(2, "node", True, "bfloat16")]


@pytest.mark.parametrize("ranks,layouts", [(4, FOUR_RANKS), (6, SIX_RANKS)], ids=["4-ranks", "6-ranks"])
def test_paths_across_two_nodes(tmp_path, graph, ranks, layouts):
    cases = []
    for k, (parts, mode, agent, dtype) in enumerate(layouts):
        partition_graph(graph, parts, str(tmp_path / f"p{k}"), method="metis", feature_dtype=dtype)
        cases.append((tmp_path / f"p{k}", mode, agent))
    proc = launch(ranks, *cases)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for k, (_, mode, agent, dtype) in enumerate(layouts):
        # ranks' lines may interleave on the shared stdout: pick the reports out by pattern
        trainers = re.findall(rf"case {k}: rank (\d+): node \d/2 partition (\d+) local (\d+) shared (\d+) remote (\d+) "
                              r"owners \d+ OK", proc.stdout)
        agents = re.findall(rf"case {k}: rank \d+: agent on node \d", proc.stdout)
        assert len(trainers) == ranks - (2 if agent else 0) and len(agents) == (2 if agent else 0), (dtype, proc.stdout)
        assert all(int(remote) > 0 for *_, remote in trainers), dtype  # every trainer read the other node by RMA
        if mode == "node":  # a node's other trainers expose nothing and read their partition from shared memory
            assert sum(int(local) == 0 for _, _, local, _, _ in trainers) == ranks - 2 - (2 if agent else 0), dtype


@pytest.mark.parametrize("ranks,parts,mode,agent,message", [
    (2, 2, "trainer", True, "needs at least 2 ranks on every node"),
    (4, 3, "trainer", False, "--data holds 3 partitions but the job has 4 trainer ranks"),
    (4, 4, "node", False, "needs one per node and the job spans 2 node(s)"),
])
def test_layout_mismatch_is_one_line_on_every_rank(tmp_path, graph, ranks, parts, mode, agent, message):
    partition_graph(graph, parts, str(tmp_path / "p"), method="random")
    proc = launch(ranks, (tmp_path / "p", mode, agent))
    assert proc.returncode != 0
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("LayoutError: ")]
    assert len(errors) == 1 and message in errors[0], proc.stdout + proc.stderr
