"""Shared fixtures: real datasets from ../shared/data when present, small generated ones always."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.environ.get("RUDDER_SHARED_DATA", os.path.join(REPO, "..", "shared", "data"))
BUNDLED_CORA = os.path.join(REPO, "data", "cora")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Under mpiexec every rank runs pytest with the same --basetemp; give each rank its own
    # (pytest clears basetemp at start, so shared ones race).
    if getattr(config.option, "with_mpi", False) and config.option.basetemp:
        from mpi4py import MPI

        if MPI.COMM_WORLD.size > 1:
            os.makedirs(config.option.basetemp, exist_ok=True)  # pytest creates only the last level
            config.option.basetemp = os.path.join(config.option.basetemp, f"rank{MPI.COMM_WORLD.rank}")
            if MPI.COMM_WORLD.rank and getattr(config.option, "xmlpath", None):  # rank 0 writes the report
                config.option.xmlpath = f"{config.option.xmlpath}.rank{MPI.COMM_WORLD.rank}"


def shared_dataset(kind: str, name: str) -> str:
    """Spec of a real dataset in ../shared/data, or skip the test with the reason."""
    if kind == "planetoid":
        path = os.path.join(SHARED_DATA, "planetoid")
        needed = os.path.join(path, f"ind.{name}.graph")
    else:
        path = os.path.join(SHARED_DATA, "musae")
        needed = os.path.join(path, f"{name}_edges.csv")
    if not os.path.isfile(needed):
        pytest.skip(f"real dataset {name} not present at {needed} (../shared/data is absent on this machine)")
    return f"{kind}:{path}:{name}"


def run_cli(*args, cwd=REPO, timeout=300, env=None):
    """Run ``python -m partitioning ARGS`` as a user would; returns the CompletedProcess."""
    full_env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
    return subprocess.run([sys.executable, "-m", "partitioning", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=full_env)


@pytest.fixture
def cora_copy(tmp_path):
    """A writable copy of the bundled Cora files (for corrupting in bad-input tests)."""
    dst = tmp_path / "cora"
    shutil.copytree(BUNDLED_CORA, dst)
    return dst
