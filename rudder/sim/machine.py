"""The simulator's machines: alpha-beta figures of a node and its links, the per-minibatch CPU
costs of a trainer, and what a GraphSAGE step costs on it (docs/simulator.md). A machine is a
named profile (``MACHINES``) or a profile file written by ``bench/calibrate_machine.py``."""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

LINKS = ("per-trainer", "shared", "per-node")
FORMAT = "rudder-machine"
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}
RATE = re.compile(r"([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)")


class MachineError(ValueError):
    """A profile file that cannot be used (the message is one line naming the file)."""


@dataclass(frozen=True)
class Machine:
    """A node and its links. Costs a calibration does not measure stay 0 (not modelled)."""
    name: str
    ranks_per_node: int  # trainers per node (their partitions' rows are read on-node)
    latency: float  # seconds per round trip: a read with off-node rows (its Gets, then the Flushes), an allreduce step
    bandwidth: float  # bytes/s of one off-node link (see ``links``)
    node_bandwidth: float  # bytes/s on-node (shared memory / NVLink)
    flops: float  # sustained GraphSAGE flop/s of one trainer (forward, backward, optimiser)
    step_overhead: float  # seconds per step besides the flops
    links: str = "per-trainer"  # per-trainer: a link each; shared: one for every trainer; per-node: one per node
    get_call: float = 0.0  # seconds per Get call (one per owner, or one per run of rows with --rma-gets runs)
    loaded_latency: float = 0.0  # a read's round trip while other trainers' bulk reads fill the link (0: latency)
    cores: int = 0  # cores every trainer's threads share (0: each trainer has its own); CPU figures are one core's
    background: float = 0.0  # other runnable threads on those cores (other jobs), as when calibrated
    byte_cpu: float = 0.0  # CPU seconds on those cores per off-node byte moved (kernel TCP path, MPI progress)
    wait_cpu: float = 0.0  # cores a yielding MPI wait keeps busy with its tests (--mpi-wait yield)
    sample_step: float = 0.0  # sampling CPU: seconds per minibatch
    sample_edge: float = 0.0  # ... and per sampled edge
    assemble_step: float = 0.0  # feature assembly CPU (lookup, copies, widening, settle): per minibatch
    assemble_byte: float = 0.0  # ... and per input feature byte (float32, as the model sees them)
    stage_step: float = 0.0  # building the blocks: per minibatch
    stage_edge: float = 0.0  # ... and per sampled edge
    # buffer work -> [seconds a minibatch, seconds an input node]: the CPU a buffer adds to a minibatch's
    # assembly over no buffer's (lookups, replacement, settling; one core's), keyed by its policy and
    # settings (rudder.sim.simulate.buffer_work) and, pooled over the settings calibrated, by its
    # policy alone; a policy without either adds none
    buffer_cpu: dict = dataclasses.field(default_factory=dict)
    rate: str = ""  # the shaping it stands for (python -m rudder.netem --rate), "" for none
    rate_bit: float = 0.0  # the same in bit/s
    calibration: dict = dataclasses.field(default_factory=dict, compare=False)  # how it was measured

    def buffer_seconds(self, work: str) -> tuple[float, float]:
        """``buffer_cpu``'s figures for a buffer's work: those of its policy and settings if they
        were calibrated, else its policy's pooled ones, else none."""
        figures = self.buffer_cpu.get(work) or self.buffer_cpu.get(pooled_key(work)) or (0.0, 0.0)
        return float(figures[0]), float(figures[1])


def pooled_key(work: str) -> str:
    """The ``buffer_cpu`` key a buffer work's figures are pooled under: its policy (the first word
    of ``rudder.sim.simulate.buffer_work``)."""
    return work.split(" ")[0]


# Perlmutter: a GPU node has 4 A100 and 4 Slingshot-11 NICs (200 Gb/s = 25 GB/s each), a CPU node
# 2 EPYC 7763 and 1 NIC. Latency: ~2 us per one-sided Get over Slingshot. flops: A100 FP32 19.5
# TFLOP/s at half of peak; a CPU node's 128 cores at ~2 TFLOP/s sustained, split over 4 trainers.
MACHINES = {
    "perlmutter-gpu": Machine("perlmutter-gpu", 4, 2e-6, 25e9, 100e9, 9.75e12, 1e-3),
    "perlmutter-cpu": Machine("perlmutter-cpu", 4, 2e-6, 25e9 / 4, 50e9, 0.5e12, 1e-3),
}
NUMBERS = [f.name for f in dataclasses.fields(Machine) if f.type == "float"]


def save_profile(path: str, machines: list[Machine]) -> None:
    """A profile file: one machine per (links, rate) it was calibrated at."""
    with open(path, "w") as f:
        json.dump({"format": FORMAT, "version": 1, "machines": [dataclasses.asdict(m) for m in machines]}, f, indent=1)


def load_profile(path: str) -> list[Machine]:
    def bad(why: str) -> MachineError:
        return MachineError(f"--machine {path}: {why}")

    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise bad(f"cannot read it ({e.strerror}); expected a named machine ({', '.join(MACHINES)}) or a "
                  "profile file of bench/calibrate_machine.py") from None
    except ValueError as e:
        raise bad(f"not JSON ({e}); expected a profile file of bench/calibrate_machine.py") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("machines"), list) \
            or not doc["machines"]:
        raise bad(f"expected {{\"format\": \"{FORMAT}\", \"machines\": [...]}} (bench/calibrate_machine.py)")
    names = {f.name for f in dataclasses.fields(Machine)}
    required = {f.name for f in dataclasses.fields(Machine)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    machines = []
    for i, entry in enumerate(doc["machines"]):
        if not isinstance(entry, dict) or not required <= set(entry) or not set(entry) <= names:
            missing = sorted(required - set(entry)) if isinstance(entry, dict) else []
            raise bad(f"machine {i}: expected the fields of rudder.sim.machine.Machine"
                      + (f" (missing {', '.join(missing)})" if missing else ""))
        numbers = {k: entry[k] for k in NUMBERS if k in entry}
        if not all(isinstance(v, (int, float)) and v >= 0 for v in numbers.values()) \
                or not entry["bandwidth"] or not entry["node_bandwidth"] or not entry["flops"]:
            raise bad(f"machine {i}: expected non-negative numbers, and positive bandwidths and flops")
        if entry.get("links", "per-trainer") not in LINKS or not isinstance(entry["ranks_per_node"], int) \
                or entry["ranks_per_node"] < 1 or not isinstance(entry.get("cores", 0), int) or entry.get("cores", 0) < 0:
            raise bad(f"machine {i}: links must be one of {', '.join(LINKS)}, ranks_per_node a positive integer and "
                      "cores a non-negative one")
        extra = entry.get("buffer_cpu", {})
        if not isinstance(extra, dict) or not all(
                isinstance(v, list) and len(v) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in v)
                for v in extra.values()):
            raise bad(f"machine {i}: buffer_cpu must map policies (and settings) to [seconds a minibatch, seconds an "
                      "input node], non-negative")
        machines.append(Machine(**entry))
    return machines


def parse_rate(text: str, flag: str = "--rate") -> float:
    """'1gbit', '250mbit' -> bit/s (tc's units, as python -m rudder.netem reads them)."""
    match = RATE.fullmatch(text.strip().lower())
    if not match or float(match[1]) <= 0:
        raise MachineError(f"{flag} {text!r}: expected a rate like 1gbit or 250mbit (units {', '.join(RATE_UNITS)})")
    return float(match[1]) * RATE_UNITS[match[2]]


def pick(path: str, machines: list[Machine], rate_bit: float | None, links: str | None) -> Machine:
    """The profile's machine for a shaping: ``rate_bit`` 0 means unshaped, None any rate; ``links``
    None any topology. One machine fits, or the profile cannot say which."""
    def fits(m: Machine) -> bool:
        if rate_bit is not None and abs(m.rate_bit - rate_bit) > 1e-6 * max(rate_bit, 1.0):
            return False
        return links is None or not m.rate or m.links == links

    found = [m for m in machines if fits(m)]
    if len(found) == 1:
        return found[0]
    have = "; ".join(f"{m.links} {m.rate or 'unshaped'}" for m in machines)
    want = " ".join(x for x in (links, "unshaped" if rate_bit == 0 else f"{rate_bit:g} bit/s" if rate_bit else "")
                    if x)
    if found:
        raise MachineError(f"--machine {path}: holds {have}; name one with --rate")
    raise MachineError(f"--machine {path}: holds {have}, not {want} (bench/calibrate_machine.py calibrates one)")


def resolve(name: str, rate_bit: float | None = None, links: str | None = None) -> Machine:
    """A named machine, or the fitting one of a profile file."""
    if name in MACHINES:
        return MACHINES[name]
    return pick(name, load_profile(name), rate_bit, links)


def sage_flops(layers, widths: list[int]) -> float:
    """Forward + backward flops of a GraphSAGE minibatch (mean aggregation over the block's edges,
    then two dense products per destination node); backward ~ twice forward."""
    fwd = 0.0
    for layer, (d_in, d_out) in zip(layers, zip(widths[:-1], widths[1:])):
        fwd += layer.src.size * d_in + 2 * 2 * layer.num_dst * d_in * d_out
    return 3 * fwd
