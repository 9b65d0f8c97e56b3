"""The MPI settings an entry point makes before MPI starts (rudder.comm.mpi_env): the PyPI MPICH
wheel across Slurm nodes gets the OFI netmod, every other case keeps MPICH's own choice."""
from __future__ import annotations

import pytest

from rudder.comm.mpi_env import NETMOD, default_netmod, prepare_mpi_environment


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


def test_prepare_sets_only_what_was_unset():
    environ = {"SLURM_STEP_NUM_NODES": "2", NETMOD: "ucx"}
    prepare_mpi_environment(environ)
    assert environ == {"SLURM_STEP_NUM_NODES": "2", NETMOD: "ucx"}
    environ = {}
    prepare_mpi_environment(environ)
    assert environ == {}
