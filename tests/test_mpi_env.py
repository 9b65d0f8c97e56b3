"""The MPI settings an entry point makes before MPI starts (rudder.comm.mpi_env): the PyPI MPICH
wheel across Slurm nodes gets the OFI netmod, and with OFI every libfabric provider but
``sockets`` unless one is named; every other case keeps MPICH's own choice."""
from __future__ import annotations

import pytest

from rudder.comm.mpi_env import NETMOD, PROVIDER, default_netmod, default_provider, prepare_mpi_environment, pypi_mpich_installed


def never_asked():
    raise AssertionError("the installed MPI is asked for only under a Slurm step across nodes")


@pytest.mark.parametrize("environ, wheel, expected", [
    ({}, never_asked, None),  # mpiexec, or a plain run
    ({"SLURM_STEP_NUM_NODES": "1"}, never_asked, None),  # one node: no address crosses PMI
    ({"SLURM_STEP_NUM_NODES": "2"}, lambda: True, "ofi"),
    ({"SLURM_STEP_NUM_NODES": "64"}, lambda: True, "ofi"),
    ({"SLURM_STEP_NUM_NODES": "2"}, lambda: False, None),  # the site's MPI
    ({"SLURM_STEP_NUM_NODES": "2", NETMOD: "ucx"}, never_asked, None),  # the user's choice stands
])
def test_the_netmod_is_ofi_only_for_the_wheel_across_slurm_nodes(environ, wheel, expected):
    assert default_netmod(environ, wheel) == expected


@pytest.mark.parametrize("environ, wheel, expected", [
    ({NETMOD: "ofi"}, lambda: True, "^sockets"),  # the user's OFI under mpiexec: sockets hangs there too
    ({NETMOD: "OFI"}, lambda: True, "^sockets"),
    ({NETMOD: "ofi", PROVIDER: "tcp"}, never_asked, None),  # the user's provider stands
    ({NETMOD: "ofi"}, lambda: False, None),  # the site's MPI and its libfabric
    ({NETMOD: "ucx"}, never_asked, None),
    ({}, never_asked, None),  # MPICH's own netmod
])
def test_ofi_excludes_the_sockets_provider_unless_one_is_named(environ, wheel, expected):
    assert default_provider(environ, wheel) == expected


def test_prepare_sets_only_what_was_unset():
    environ = {"SLURM_STEP_NUM_NODES": "2", NETMOD: "ucx"}
    prepare_mpi_environment(environ)
    assert environ == {"SLURM_STEP_NUM_NODES": "2", NETMOD: "ucx"}
    environ = {}
    prepare_mpi_environment(environ)
    assert environ == {}
    environ = {"SLURM_STEP_NUM_NODES": "2", PROVIDER: "tcp"}
    prepare_mpi_environment(environ)  # the netmod chosen, the named provider kept
    assert environ == {"SLURM_STEP_NUM_NODES": "2", PROVIDER: "tcp", **({NETMOD: "ofi"} if pypi_mpich_installed() else {})}
