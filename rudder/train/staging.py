"""A minibatch's inputs (blocks, features, labels) put on the model's device by the pipeline
thread, while the training thread computes the previous step.

On CPU that is building the blocks (the features and labels are the pipeline's arrays, not
copied). On CUDA every index tensor of the torch blocks and the labels are packed into one
reused pinned int64 buffer and the features into a reused pinned float32 buffer, and both are
sent with non-blocking copies on a stream of the stager's own; the pipeline thread then waits
for those copies (so the pinned buffers are free again and the tensors complete before the step
sees them) while the training thread's kernels run on the compute stream. ``claim``, in the
training thread, tells the allocator that the compute stream uses the tensors, so their memory
is not reused while its kernels may still read it. (DGL's blocks, with ``--model-impl dgl`` and
a CUDA build of DGL, are moved there by DGL itself.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rudder.train.sage import Block


@dataclass
class DeviceInputs:
    blocks: list
    x: torch.Tensor
    labels: torch.Tensor
    owned: tuple = ()  # CUDA: the tensors the stager's stream allocated


class InputStager:
    def __init__(self, model, device: torch.device, labels_of):
        """``model``: the ``GraphSAGE`` whose blocks to build; ``labels_of(seeds)``: their labels."""
        self.model, self.device, self.labels_of = model, device, labels_of
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.stream = torch.cuda.Stream(device)
            self.copied = torch.cuda.Event(blocking=True)  # the pipeline thread sleeps, not spins, on it
            self.pinned_ints = torch.empty(0, dtype=torch.int64)
            self.pinned_x = torch.empty(0, dtype=torch.float32)

    def __call__(self, item) -> DeviceInputs:
        """The inputs of a prepared minibatch (``rudder.prefetch.pipeline.Prepared``) on the device."""
        blocks = self.model.blocks(item.minibatch.layers)
        labels = torch.from_numpy(self.labels_of(item.seeds))
        x = torch.from_numpy(item.x)
        if not self.cuda:
            return DeviceInputs(blocks, x, labels)
        torch_blocks = self.model.impl == "torch"  # DGL's blocks move themselves, in ``claim``
        ints = [t for b in blocks for t in b.tensors()] if torch_blocks else []
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            device_ints, device_x = self._send(ints + [labels], x)
            parts = device_ints.split([t.numel() for t in ints + [labels]])
            if torch_blocks:
                blocks = [Block.of_tensors(b.num_src, b.num_dst, parts[4 * i:4 * i + 4]) for i, b in enumerate(blocks)]
            owned = (device_ints, device_x, *(b.degree for b in blocks if torch_blocks))
            self.copied.record(self.stream)
        self.copied.synchronize()
        return DeviceInputs(blocks, device_x, parts[-1], owned)

    def _send(self, ints: list, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One int64 and one float32 copy through the reused pinned buffers, on the current stream."""
        count = sum(t.numel() for t in ints)
        self.pinned_ints, self.pinned_x = _fit(self.pinned_ints, (count,)), _fit(self.pinned_x, tuple(x.shape))
        host_ints, host_x = self.pinned_ints[:count], self.pinned_x[:x.shape[0]]
        torch.cat(ints, out=host_ints)
        host_x.copy_(x)  # a torch copy: the training thread runs meanwhile
        return host_ints.to(self.device, non_blocking=True), host_x.to(self.device, non_blocking=True)

    def claim(self, inputs: DeviceInputs) -> DeviceInputs:
        """In the training thread, before the step uses ``inputs``."""
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            for tensor in inputs.owned:
                tensor.record_stream(compute)
            if self.model.impl == "dgl":
                inputs.blocks = [b.to(self.device) for b in inputs.blocks]
        return inputs


def _fit(buffer: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``buffer`` if it holds ``shape`` (rows, ...), else a pinned one twice as large."""
    rows = shape[0] if shape else 0
    if buffer.shape[1:] == tuple(shape[1:]) and buffer.shape[0] >= rows:
        return buffer
    grown = max(rows, 2 * buffer.shape[0]) if buffer.shape[1:] == tuple(shape[1:]) else rows
    return torch.empty((grown, *shape[1:]), dtype=buffer.dtype, pin_memory=True)

