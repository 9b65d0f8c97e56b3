"""The simulator's time model: what each step of a run costs on a machine, and the pipeline that
overlaps them (docs/simulator.md, "The time model").

Per trainer r and minibatch i, from the counts the simulation made:
  prepare[r, i] = sampling, assembly and block CPU + latency and Get calls of its reads (and of
                  its agent requests) + its off-node bytes over its link, the link shared with
                  the trainers that fetch in the same step (``link_seconds``);
  train[r, i]   = forward + backward + optimiser: step_overhead + flops / flop rate;
  sync[i]       = the gradient allreduce, after the slowest trainer's train.
``pipeline_end`` replays ``rudder.prefetch.pipeline``: with depth 0 each minibatch is prepared
after the previous step; with depth d a thread prepares ahead and blocks once d prepared
minibatches wait in its queue. On one shared link with overlap the trainers' pipeline threads
run at their own pace, so their fetches do not start together: ``shared_link_pipeline`` replays
the same pipeline in time, the link divided at every moment between the fetches on it then.
An epoch is the time between the ends of its last step and the previous epoch's; the epoch time
is the median over the steady epochs (``rudder.logs.metrics``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rudder.comm.dist_array import COPY_FIRST_MAX_BYTES
from rudder.logs import metrics
from rudder.sim.machine import Machine

AGENT_MESSAGE_BYTES = 1024  # a request and its answer, JSON of a few hundred bytes each


def link_seconds(nbytes: np.ndarray, m: Machine) -> np.ndarray:
    """(trainers, steps) off-node bytes -> seconds each trainer's bytes take to arrive.
    per-trainer: every trainer its own link. shared: one link, fairly shared by the trainers
    fetching at once (processor sharing from the step's start: a trainer's bytes are done when
    every smaller fetch and as many bytes of each larger one have crossed). per-node: each node
    receives on its own link, and the senders' links are taken as balanced, so a node waits for
    its own bytes or for the mean node's, whichever is more."""
    b = np.asarray(nbytes, dtype=np.float64)
    if m.links == "per-trainer" or b.shape[0] < 2:
        return b / m.bandwidth
    if m.links == "shared":
        order = np.argsort(b, axis=0, kind="stable")
        s = np.take_along_axis(b, order, axis=0)
        k = np.arange(b.shape[0])[:, None]
        done = (np.cumsum(s, axis=0) - s + (b.shape[0] - k) * s) / m.bandwidth
        out = np.empty_like(done)
        np.put_along_axis(out, order, done, axis=0)
        return out
    node = np.arange(b.shape[0]) // m.ranks_per_node
    per_node = np.stack([b[node == n].sum(axis=0) for n in range(node.max() + 1)])
    return np.maximum(per_node[node], per_node.mean(axis=0)) / m.bandwidth


def allreduce_seconds(params: int, trainers: int, m: Machine) -> float:
    """Ring allreduce of float32 gradients: 2(p-1) latency steps and 2(p-1)/p of the bytes from
    every trainer; over a shared link the trainers' bytes queue on the one link."""
    if trainers < 2:
        return 0.0
    per_trainer = 2 * (trainers - 1) / trainers * 4 * params
    on_link = per_trainer * (trainers if m.links == "shared" else m.ranks_per_node if m.links == "per-node" else 1)
    return 2 * (trainers - 1) * m.latency + on_link / m.bandwidth


def pipeline_end(prepare: np.ndarray, train: np.ndarray, sync: np.ndarray, depth: int) -> np.ndarray:
    """When each step ends, (steps,): trainers (rows of ``prepare``, ``train``) meet in every
    step's allreduce (``sync``). ``depth`` 0: prepare, then train; d >= 1: the producer starts a
    minibatch once it handed the previous one over, which waits until fewer than d are queued."""
    trainers, steps = prepare.shape
    end = np.zeros(steps)
    taken = np.zeros((trainers, steps))  # when the training thread took minibatch i
    handed = np.zeros(trainers)  # when the producer handed its last minibatch over
    last = 0.0
    for i in range(steps):
        if depth == 0:
            ready = last + prepare[:, i]
        else:
            ready = handed + prepare[:, i]
            if i >= depth:
                ready = np.maximum(ready, taken[:, i - depth])
            handed = ready
        taken[:, i] = np.maximum(last, ready)
        last = end[i] = float((taken[:, i] + train[:, i]).max() + sync[i])
    return end


HEAD, LINK, HAND, BLOCKED, DONE = range(5)  # a pipeline thread's phase in shared_link_pipeline


def shared_link_pipeline(head: np.ndarray, nbytes: np.ndarray, floor: np.ndarray, train: np.ndarray, sync: np.ndarray,
                         depth: int, bandwidth: float) -> tuple[np.ndarray, np.ndarray]:
    """``pipeline_end`` with the reads' bytes on one link shared over time, (step ends, seconds
    each read's bytes spent on the link). Each (trainer, minibatch) is prepared as: ``head``
    seconds off the link (CPU, round trips), then ``nbytes`` on the link, which carries
    ``bandwidth`` bytes/s divided evenly between the reads on it at each moment (processor
    sharing), ending no sooner than ``floor`` seconds after the start (a copy overlapping the
    Gets). Hand-over, queue and steps as in ``pipeline_end``, which this equals without bytes."""
    trainers, steps = head.shape
    end, ready, on_link = np.full(steps, np.nan), np.full((trainers, steps), np.nan), np.zeros((trainers, steps))
    step, phase = np.zeros(trainers, dtype=np.int64), np.full(trainers, BLOCKED)
    at = np.full(trainers, np.nan)  # when the phase ends (HEAD, HAND), nan while not known
    left, floor_end, link_start, started = np.zeros(trainers), np.zeros(trainers), np.zeros(trainers), np.zeros(trainers)
    t, known = 0.0, 0  # known: steps whose end is known

    def resolve() -> None:
        nonlocal known
        while known < steps and not np.isnan(ready[:, known]).any():
            taken = np.maximum(end[known - 1] if known else 0.0, ready[:, known])
            end[known] = (taken + train[:, known]).max() + sync[known]
            known += 1
        for r in np.flatnonzero((phase == BLOCKED) | ((phase == HAND) & np.isnan(at))):
            j = step[r]
            if phase[r] == BLOCKED:  # depth 0: after the previous step; else after handing the previous one over
                begin = (0.0 if j == 0 else end[j - 1] if j - 1 < known else np.nan) if depth == 0 else \
                    (ready[r, j - 1] if j else 0.0)
                if not np.isnan(begin):
                    phase[r], started[r], at[r] = HEAD, begin, begin + head[r, j]
            elif phase[r] == HAND and np.isnan(at[r]):  # the queue has room once minibatch j - depth was taken
                k = j - depth
                if depth == 0 or k < 0:
                    at[r] = t
                elif k < known:
                    at[r] = max(t, end[k - 1] if k else 0.0, ready[r, k])

    resolve()
    while (phase != DONE).any():
        on = (phase == LINK) & (left > 0)
        share = bandwidth / max(1, int(on.sum()))
        due = np.where((phase == HEAD) | (phase == HAND), at, np.inf)
        due = np.where(phase == LINK, np.where(left > 0, t + left / share, floor_end), due)
        nxt = max(t, float(np.nanmin(np.where(np.isnan(due), np.inf, due))))  # a floor already passed: now
        if nxt == np.inf:
            raise RuntimeError("shared_link_pipeline: no thread can go on (a bug)")
        left[on] = np.maximum(0.0, left[on] - (nxt - t) * share)
        t = nxt
        for r in np.flatnonzero(due <= t):
            j = step[r]
            if phase[r] == HEAD:
                phase[r], left[r], link_start[r] = LINK, nbytes[r, j], t
                floor_end[r] = started[r] + floor[r, j]
            elif phase[r] == LINK and left[r] <= 1e-9 * max(1.0, nbytes[r, j]) and floor_end[r] <= t:
                phase[r], at[r], left[r] = HAND, np.nan, 0.0
                on_link[r, j] = t - link_start[r]
            elif phase[r] == HAND:
                ready[r, j], step[r] = t, j + 1
                phase[r], at[r] = (DONE if j + 1 == steps else BLOCKED), np.nan
        resolve()
    return end, on_link


def epoch_seconds(end: np.ndarray, epoch_of: np.ndarray, epochs: list[int]) -> list[float]:
    """Each epoch's seconds: from the end of the previous epoch's last step to its own last."""
    last = {e: float(end[epoch_of == e][-1]) for e in epochs}
    return [last[e] - (last[e - 1] if e - 1 in last else 0.0) for e in epochs]


@dataclass(frozen=True)
class PerThread:
    """A figure for each of a trainer's two threads: the pipeline thread's preparing (sampling,
    assembly, blocks, Get calls) and the training thread's steps. The time model keeps three:
    the slowdown of each on shared cores, their CPU seconds at one core's speed (summed over
    trainers and steps), and the share of the epoch each is busy."""
    prepare: float
    train: float


def busy_shares(work: PerThread, slowdown: PerThread, trainers: int, span: float) -> PerThread:
    """The share of ``span`` seconds a thread of each kind spends on CPU work (at most all of it)."""
    return PerThread(prepare=min(1.0, work.prepare * slowdown.prepare / (trainers * span)),
                     train=min(1.0, work.train * slowdown.train / (trainers * span)))


def contention(m: Machine, trainers: int, depth: int, background: float = 0.0) -> PerThread:
    """How much slower CPU work runs when the trainers' threads share ``m.cores`` (with
    ``background`` runnable threads of other jobs) and every thread that has work or waits in MPI
    is runnable (``--mpi-wait spin``: MPI's waits poll), the cores shared evenly. Without overlap
    a trainer has one thread; with it, its pipeline thread too."""
    if not m.cores:
        return PerThread(1.0, 1.0)
    s = max(1.0, (trainers * (2 if depth else 1) + background) / m.cores)
    return PerThread(s, s)


def yielding_slowdown(m: Machine, trainers: int, depth: int, background: float, busy: PerThread) -> PerThread:
    """``contention`` where waiting threads sleep (``--mpi-wait yield``): only threads with work
    share the cores. ``busy``: the share of the epoch a pipeline thread (``prepare``) and a
    training thread (``train``) spend on CPU work, on average. The training threads compute
    together (each step starts when the allreduce before it ends), so while one trains, every
    training thread does, beside the pipeline threads that are busy then; while a pipeline thread
    prepares, the others are busy at their mean share and the training threads at theirs. Without
    overlap the trainers prepare and train together, one thread each."""
    if not m.cores:
        return PerThread(1.0, 1.0)
    if not depth:
        s = max(1.0, (trainers + background) / m.cores)
        return PerThread(s, s)
    n = trainers
    return PerThread(prepare=max(1.0, (1 + (n - 1) * busy.prepare + n * busy.train + background) / m.cores),
                    train=max(1.0, (n + n * busy.prepare + background) / m.cores))


def step_costs(m: Machine, sampled: list, fetched: list[dict], feat_dim: int, depth: int,
               background: float | None = None, slowdown: PerThread | None = None, buffer_work: str = "") -> dict:
    """(trainers, steps) arrays of a policy's prepare and train seconds at a pipeline depth:
    ``sampled``: each trainer's ``Sampled``; ``fetched``: its replay columns; ``background``:
    other jobs' runnable threads (default: the machine's); ``slowdown``: how much slower the CPU
    work runs on the shared cores (default: every thread runnable, ``contention``). ``work``: the
    same CPU work at one core's speed (preparing and training), for ``busy_shares``; ``buffer_work``:
    the buffer whose CPU (``m.buffer_seconds``) the assembly adds (``rudder.sim.simulate.buffer_work``)."""
    def stack(rows, name):
        return np.stack([getattr(r, name) if hasattr(r, name) else r[name] for r in rows]).astype(np.float64)

    edges, decisions = stack(sampled, "edges"), stack(fetched, "decisions_at")
    inputs, rows_rma, bytes_rma = stack(sampled, "input_nodes"), stack(fetched, "rows_rma"), stack(fetched, "bytes_rma")
    cpu_bytes = (inputs - rows_rma) * feat_dim * 4  # the rest came by RMA
    copy = m.assemble_byte * cpu_bytes
    per_minibatch, per_input = m.buffer_seconds(buffer_work)
    cpu = (m.sample_step + m.sample_edge * edges + m.assemble_step + per_minibatch + per_input * inputs + m.stage_step
           + m.stage_edge * edges)
    # A read whose shared-memory rows exceed COPY_FIRST_MAX_BYTES issues its Gets first and copies
    # those rows, and the buffer's hits, while the Gets fly (rudder.comm.dist_array): that copy
    # overlaps the minibatch's communication instead of preceding it. The read's shared-memory
    # rows are its inputs less what came by RMA and what the buffer held, at their stored size.
    stored = np.divide(bytes_rma, rows_rma, out=np.zeros_like(rows_rma), where=rows_rma > 0)
    nearby = np.maximum(0.0, inputs - rows_rma - stack(fetched, "hits")) * stored
    beside = (rows_rma > 0) & (nearby > COPY_FIRST_MAX_BYTES)
    train = m.step_overhead + stack(sampled, "flops") / m.flops
    overlapped = depth > 0
    # With overlap, other trainers' bulk feature reads fill the link while this one's small
    # sampling reads wait in its queue: those pay the loaded round trip. A feature read is itself
    # that bulk, and link_seconds already charges it for the other trainers' bytes crossing the
    # link beside it; a loaded round trip on top would count the same queue twice.
    loaded = overlapped and m.links != "per-trainer" and len(sampled) > 1 and m.loaded_latency
    sampling_latency = m.loaded_latency if loaded else m.latency
    if slowdown is None:
        slowdown = contention(m, len(sampled), depth, m.background if background is None else background)
    calls = stack(sampled, "sample_seconds") + stack(fetched, "fetch_seconds")  # Get calls: the reading thread's CPU
    fixed = (calls * slowdown.prepare
             + stack(sampled, "adjacency_rounds") * sampling_latency + stack(fetched, "fetch_rounds") * m.latency
             + 2 * m.latency * decisions)
    nbytes = stack(sampled, "adjacency_bytes_remote") + bytes_rma + AGENT_MESSAGE_BYTES * decisions
    comm = fixed + link_seconds(nbytes, m)
    copying = copy * slowdown.prepare
    prepare = cpu * slowdown.prepare + np.where(beside, np.maximum(copying, comm), copying + comm)
    costs = {"prepare": prepare, "comm": comm, "train": train * slowdown.train, "slowdown": slowdown,
             "work": PerThread(prepare=float((cpu + copy + calls).sum()), train=float(train.sum())),
             "bytes": float(nbytes.sum())}
    if m.links == "shared" and len(sampled) > 1 and depth > 0:  # fetches at each thread's own pace (module docstring)
        costs["link"] = {"head": cpu * slowdown.prepare + fixed + np.where(beside, 0.0, copying), "bytes": nbytes,
                         "floor": np.where(beside, (cpu + copy) * slowdown.prepare, 0.0), "fixed": fixed,
                         "bandwidth": m.bandwidth}
    return costs


def epoch_time(costs: dict, sync: float, depth: int, epoch_of: np.ndarray, epochs: int,
               phases: np.ndarray | None = None, reach: int | None = None) -> dict:
    """The modelled epoch time (``rudder.logs.metrics``' definition) at a pipeline depth, and
    the share of its steps the slowest trainer spent reading remote data; ``reach``: the epochs
    at each end that are not steady (by default those the modelled pipeline's run-ahead reaches)."""
    if reach is None:
        reach = metrics.pipeline_reach(metrics.run_ahead(depth, 0), int(np.count_nonzero(epoch_of == epoch_of[0])))
    timed = metrics.timed_epochs(list(range(epochs)), reach)
    syncs, link = np.full(epoch_of.size, sync), costs.get("link")
    if link is None:
        end, comm = pipeline_end(costs["prepare"], costs["train"], syncs, depth), costs["comm"]
    else:
        end, on_link = shared_link_pipeline(link["head"], link["bytes"], link["floor"], costs["train"], syncs, depth,
                                            link["bandwidth"])
        comm = link["fixed"] + on_link
    per_epoch = epoch_seconds(end, epoch_of, list(range(epochs)))
    later = np.isin(epoch_of, timed)
    span = float(np.diff(np.concatenate([[0.0], end]))[later].sum())
    return {"seconds": metrics.epoch_time([per_epoch[e] for e in timed], None if phases is None else np.asarray(phases)[timed]),
            "per_epoch": per_epoch,
            "comm_share": float(comm.max(axis=0)[later].sum() / max(1e-12, span)), "comm_seconds": float(comm.sum())}


MAX_PASSES = 50  # of modelled_epoch's fixed point; it settles in a few
SETTLED = 1e-3  # a slowdown that moved less than this between passes has settled


def modelled_epoch(m: Machine, sampled: list, fetched: list[dict], feat_dim: int, depth: int, sync: float,
                   epoch_of: np.ndarray, epochs: int, background: float | None = None, waiting: str = "spin",
                   buffer_work: str = "", phases: np.ndarray | None = None, reach: int | None = None) -> dict:
    """``epoch_time`` of a policy's ``step_costs``, with the cores shared as ``waiting`` (a resolved
    ``--mpi-wait``) shares them, and the ``slowdown`` it came to. Spinning, every thread is always
    runnable (``contention``); yielding, only busy ones are (``yielding_slowdown``), and each
    yielding wait keeps ``wait_cpu`` of a core busy. Moving the bytes keeps ``byte_cpu`` seconds a
    byte of the cores busy either way. The busy shares and the seconds spent waiting depend on
    how long the epoch takes, which depends on the slowdown: from spinning's slowdown without the
    bytes' CPU, each pass sets the slowdown from the epoch modelled with the last one, until it
    settles. ``buffer_work``: as ``step_costs`` takes it; ``phases``: each epoch's phase (``--shift``)."""
    background = m.background if background is None else background
    slowdown = contention(m, len(sampled), depth, background)
    for _ in range(MAX_PASSES):
        costs = step_costs(m, sampled, fetched, feat_dim, depth, background, slowdown, buffer_work)
        out = epoch_time(costs, sync, depth, epoch_of, epochs, phases, reach)
        if not m.cores:
            break
        n, span, work = len(sampled), max(1e-12, sum(out["per_epoch"])), costs["work"]
        moving = m.byte_cpu * costs["bytes"] / span  # cores the bytes' CPU takes
        if waiting == "spin":
            settled = contention(m, n, depth, background + moving)
        else:  # the pipeline threads wait for their reads, the training threads in the allreduce
            waits = m.wait_cpu * (out["comm_seconds"] + n * sync * epoch_of.size) / span
            settled = yielding_slowdown(m, n, depth, background + moving + waits, busy_shares(work, slowdown, n, span))
        if abs(settled.prepare - slowdown.prepare) < SETTLED and abs(settled.train - slowdown.train) < SETTLED:
            break
        slowdown = settled
    return {**out, "slowdown": slowdown}

