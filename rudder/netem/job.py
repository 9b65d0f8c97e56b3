"""Starting the command inside the shaped network, and ending it whatever happens.

The command runs as the first process of a new PID namespace (``unshare --pid --fork
--kill-child``), started in the job's network namespace. Each link of the chain takes the next one
down: the tool's death kills ``unshare`` (PR_SET_PDEATHSIG), ``unshare``'s death kills the command
(``--kill-child``), and when the first process of a PID namespace dies the kernel kills every
other process in it. So a SIGKILL anywhere (the tool, ``unshare``, mpiexec) leaves no process, and
with no process and no descriptor left the network namespaces go too.

MPI: MPICH over OFI's TCP provider is the transport that crosses the shaped links (docs/network.md);
``MPIR_CVAR_NUM_CLIQUES`` makes each emulated node a node to MPICH, ranks assigned round robin
(rank r on node r % N). With per-node links, each program on the mpiexec line is prefixed with the
rank shim (``python -m rudder.netem.rank``), which moves the rank into its node's namespace."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

from rudder.netem.namespaces import NetemError, setns
from rudder.netem.topology import Network

MPIEXEC_NAMES = {"mpiexec", "mpirun", "mpiexec.hydra"}
# hydra's options that take one value (two for -genv/-env); any other option is a flag
ONE_VALUE = {"genvlist", "envlist", "f", "hostfile", "machinefile", "hosts", "host", "rankmap", "wdir", "configfile",
             "n", "np", "launcher", "launcher-exec", "rmk", "topolib", "bind-to", "binding", "map-by", "membind",
             "demux", "errfile-pattern", "outfile-pattern", "prepend-pattern", "gpus-per-proc", "iface", "localhost",
             "nameserver", "ppn", "usize", "memory-alloc-kinds", "order-nodes"}
TWO_VALUES = {"genv", "env"}
SHIM = [sys.executable, "-m", "rudder.netem.rank"]
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def is_mpiexec(argv: list[str]) -> bool:
    return os.path.basename(argv[0]) in MPIEXEC_NAMES


def mpiexec_sections(argv: list[str]) -> list[tuple[int, int | None]]:
    """(index of the program, its -n) for each ':'-separated section of an mpiexec command line."""
    sections, ranks, i = [], None, 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-") and arg != "-":
            name, eq, value = arg.lstrip("-").partition("=")
            values = 0 if eq else 2 if name in TWO_VALUES else 1 if name in ONE_VALUE else 0
            if name in ("n", "np"):
                text = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                ranks = int(text) if text.isdigit() else None
            i += 1 + values
        elif arg == ":":
            i += 1
        else:
            sections.append((i, ranks))
            ranks = None
            i = argv.index(":", i) + 1 if ":" in argv[i:] else len(argv)
    return sections


def ranks_of(argv: list[str]) -> int | None:
    """The job's rank count when the command is ``mpiexec -n N ...`` (all sections), else None."""
    if not is_mpiexec(argv):
        return None
    counts = [n for _, n in mpiexec_sections(argv)]
    return sum(counts) if counts and None not in counts else None


def with_rank_shim(argv: list[str]) -> list[str]:
    """The mpiexec line with the rank shim before each section's program."""
    for bad in ("-pmi-port", "-configfile"):
        if any(arg.lstrip("-") == bad.lstrip("-") for arg in argv[1:]):
            raise NetemError(f"--links per-node: the mpiexec option {bad} is not supported (the rank shim needs the "
                             "programs on the command line and PMI over the inherited descriptor, hydra's default)")
    sections = mpiexec_sections(argv)
    if not sections:
        raise NetemError("the command after -- names no program for mpiexec to run")
    out = list(argv)
    for index, _ in reversed(sections):
        out[index:index] = SHIM
    return out


def job_environment(network: Network) -> dict[str, str]:
    """The caller's environment plus the MPI transport that crosses the shaping and, for per-node
    links, where the rank shim finds each node's namespace."""
    env = dict(os.environ, MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp",
               MPIR_CVAR_NUM_CLIQUES=str(len(network.node_ns)))
    if network.topology == "per-node":
        env["RUDDER_NETEM_NETNS"] = ",".join(ns.path for ns in network.node_ns)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    return env


class Job:
    """The command, running in ``network.job_ns`` as the first process of its own PID namespace."""

    def __init__(self, argv: list[str], network: Network):
        if network.topology == "per-node" and is_mpiexec(argv):
            argv = with_rank_shim(argv)
        self.argv, self.env = argv, job_environment(network)
        tool, ns_fd = os.getpid(), network.job_ns.fd

        def in_the_network():  # in the child, before exec (the tool has no other thread yet)
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != tool:  # the tool died before the line above: do not outlive it
                os._exit(1)
            setns(ns_fd)

        try:
            self.proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--", *argv],
                                         env=self.env, preexec_fn=in_the_network,
                                         start_new_session=True)
        except OSError as e:
            raise NetemError(f"cannot start the command: {e}") from e

    def forward(self, sig: int) -> None:
        """Send ``sig`` to the command (which, as a PID namespace's first process, ignores the
        signals it has no handler for: the caller follows up with ``kill``)."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                children = [int(pid) for pid in f.read().split()]
        except OSError:
            return
        for pid in children:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """End the whole job now (unshare's death kills the command and with it its PID namespace)."""
        self.proc.kill()

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
