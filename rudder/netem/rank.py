"""The rank shim: ``python -m rudder.netem.rank PROGRAM ARGS`` moves this process into its emulated
node's network namespace and execs PROGRAM there (rudder.netem.job puts it on the mpiexec line for
per-node links).

The rank comes from the environment hydra sets (``PMI_RANK``); MPICH puts rank r on clique r % N,
so the shim enters node r % N of ``RUDDER_NETEM_NETNS`` (the tool's namespace paths). Moving is
safe before the program starts MPI: the PMI connection is a descriptor inherited from the proxy
(``PMI_FD``), untouched by the namespace, and every socket MPI opens later is opened in the node's
namespace."""
from __future__ import annotations

import os
import sys

from rudder.netem.namespaces import enter


def main(argv: list[str]) -> None:
    paths = os.environ.get("RUDDER_NETEM_NETNS", "").split(",")
    rank = os.environ.get("PMI_RANK", os.environ.get("PMIX_RANK", ""))
    if not argv:
        sys.exit("rudder.netem.rank: expected the program to run after it")
    if not rank.isdigit() or not paths[0]:
        sys.exit("rudder.netem.rank: needs PMI_RANK (set by mpiexec) and RUDDER_NETEM_NETNS (set by python -m "
                 "rudder.netem --links per-node)")
    try:
        enter(paths[int(rank) % len(paths)])
    except OSError as e:
        sys.exit(f"rudder.netem.rank: rank {rank} cannot enter its node's network namespace ({e}); is the tool gone?")
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.exit(f"rudder.netem.rank: cannot run {argv[0]}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
