"""What the MPI library is told before it starts: settings it reads from the environment in
MPI_Init, so the entry points (drivers/, the partition tool's parallel mode) call
``prepare_mpi_environment`` before anything imports ``mpi4py.MPI``. Nothing here loads MPI.

The PyPI ``mpich`` wheel (CH4 device ``ucx ofi``, UCX first) launched by Slurm's PMI plugin on
more than one node can abort in MPI_Init by chance. Its UCX netmod puts each node root's address
into PMI as a fixed 4,096-byte card: the address is a few hundred bytes, the rest whatever the
heap held, hex-encoded in segments of 511 bytes with zero runs shortened. A segment of heap bytes
that do not shorten makes a PMI-1 request longer than the 1,024 bytes Slurm's PMI server reads at
once; Slurm rejects it ("value not properly terminated"), still answers success, and a peer reads
a garbled address (UCX: "Assertion `*addr_version == UCP_OBJECT_VERSION_V2' failed").
OFI's address is 16 bytes. So with the wheel, across Slurm nodes, the netmod is OFI unless the
user chose one (docs/cluster.md, "MPI from PyPI under Slurm").

With OFI and no provider named, MPICH picks libfabric's deprecated ``sockets`` provider where no
fabric's is present, and a job across two nodes could then hang in MPI_Init, every rank in MPI's
progress loop (MPICH knows of collectives blocking on ``sockets``: pmodels/mpich#5437). So
wherever the wheel's netmod is OFI and the user named no provider, ``sockets`` is excluded
(``FI_PROVIDER=^sockets``): MPICH then takes ``tcp`` on Ethernet, and a fabric's provider
(verbs, EFA, PSM2) where there is one (docs/cluster.md has the runs).
"""
from __future__ import annotations

import importlib.metadata
import os

NETMOD = "MPIR_CVAR_CH4_NETMOD"
PROVIDER = "FI_PROVIDER"
NOT_SOCKETS = "^sockets"  # libfabric's syntax for every provider but this one


def pypi_mpich_installed() -> bool:
    """Whether the PyPI ``mpich`` wheel is installed (the MPI that mpi4py loads when it is)."""
    try:
        importlib.metadata.distribution("mpich")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def default_netmod(environ, pypi_mpich=pypi_mpich_installed) -> str | None:
    """The netmod to choose for this rank, or None to leave MPICH's own choice (``pypi_mpich``:
    asked last, only under a Slurm step across nodes)."""
    nodes = environ.get("SLURM_STEP_NUM_NODES", "")  # srun sets it for every task of the step
    if NETMOD in environ or not (nodes.isdigit() and int(nodes) > 1) or not pypi_mpich():
        return None
    return "ofi"


def default_provider(environ, pypi_mpich=pypi_mpich_installed) -> str | None:
    """The libfabric providers to allow, or None to leave MPICH's own choice: every one but
    ``sockets`` where the wheel's netmod is OFI (ours or the user's) and no provider is named."""
    if environ.get(NETMOD, "").lower() != "ofi" or PROVIDER in environ or not pypi_mpich():
        return None
    return NOT_SOCKETS


def prepare_mpi_environment(environ=os.environ) -> None:
    netmod = default_netmod(environ)
    if netmod is not None:
        environ[NETMOD] = netmod
    provider = default_provider(environ)
    if provider is not None:
        environ[PROVIDER] = provider
