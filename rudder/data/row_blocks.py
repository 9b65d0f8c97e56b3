"""Minibatch feature matrices reused once nothing refers to them.

A minibatch's input matrix can be hundreds of MB (wide features, or a large minibatch on a big
graph). Above glibc's largest mmap threshold (32 MB) every fresh matrix is a new mapping, and the
kernel zeroes each of its pages when the assembly first writes it: for wide features that zeroing
took about as many cycles as the model's matrix products (docs/results-features.md). So the
assemblers take their matrices from ``RowBlocks``, which hands out a block again only when no
array, view or tensor still refers to it: the training step, autograd's saved inputs and the
pipeline's queue all hold references, so a block in use is never reused, whatever holds it.
"""
from __future__ import annotations

import sys
import threading

import numpy as np

# room for larger minibatches to come: untouched rows cost address space, not memory
HEADROOM = 1.125


class RowBlocks:
    def __init__(self, dim: int, keep: int, dtype=np.float32):
        """Blocks of ``dim`` columns; ``keep``: how many idle blocks to hold on to (the matrices a
        run has in flight at once: those queued, the one being assembled, the one being trained)."""
        self.dim, self.keep, self.dtype = dim, keep, dtype
        self.blocks: list[np.ndarray] = []
        self.lock = threading.Lock()  # taken by the pipeline thread, released by the training thread
        self.fresh = self.reused = 0
        # the references a block has when only this pool holds it, counted where ``_idle`` counts them
        self.blocks.append(np.empty((0, dim), dtype))
        self.idle_refs = self._refs(0)
        self.blocks.clear()

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self.blocks[i])

    def _idle(self) -> list[int]:
        return [i for i in range(len(self.blocks)) if self._refs(i) <= self.idle_refs]

    def take(self, rows: int) -> np.ndarray:
        """A (rows, dim) matrix of undefined contents, as ``np.empty``'s."""
        with self.lock:
            idle = self._idle()
            fits = [i for i in idle if self.blocks[i].shape[0] >= rows]
            if fits:
                self.reused += 1
                return self.blocks[min(fits, key=lambda i: self.blocks[i].shape[0])][:rows]
            # none fits: the idle ones are too small, so they go, and a larger block takes their place
            self._drop(idle)
            block = np.empty((int(rows * HEADROOM) + 1, self.dim), self.dtype)
            if len(self.blocks) < self.keep:
                self.blocks.append(block)
            self.fresh += 1
            return block[:rows]

    def release_idle(self) -> None:
        """Give the idle blocks' memory back (before an evaluation, whose own peak comes on top)."""
        with self.lock:
            self._drop(self._idle())

    def _drop(self, indices: list[int]) -> None:
        gone = set(indices)
        self.blocks = [b for i, b in enumerate(self.blocks) if i not in gone]
