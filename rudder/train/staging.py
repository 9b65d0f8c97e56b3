"""A minibatch's inputs (blocks, features, labels) put on the model's device by the pipeline
thread, while the training thread computes the previous step.

On CPU that is building the blocks (the features and labels are the pipeline's arrays, not
copied). On CUDA every index tensor of the torch blocks and the labels are packed into one
reused pinned int64 buffer and the features into a reused pinned float32 buffer, and both are
sent with non-blocking copies on a stream of the stager's own; the pipeline thread then waits
for those copies (so the pinned buffers are free again and the tensors complete before the step
sees them) while the training thread's kernels run on the compute stream. ``claim``, in the
training thread, tells the allocator that the compute stream uses the tensors, so their memory
is not reused while its kernels may still read it.
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
            self.copied = torch.cuda.Event()
            self.pinned_ints = torch.empty(0, dtype=torch.int64)
            self.pinned_x = torch.empty(0, dtype=torch.float32)

    def __call__(self, item) -> DeviceInputs:
        """The inputs of a prepared minibatch (``rudder.prefetch.pipeline.Prepared``) on the device."""
        blocks = self.model.blocks(item.minibatch.layers)
        labels = self.labels_of(item.seeds)
        if not self.cuda:
            return DeviceInputs(blocks, torch.from_numpy(item.x), torch.from_numpy(labels))
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            if self.model.impl == "dgl":  # DGL blocks move themselves (with a CUDA build of DGL)
                blocks, ints = [b.to(self.device) for b in blocks], [torch.from_numpy(labels)]
            else:
                ints = [t for b in blocks for t in b.tensors()] + [torch.from_numpy(labels)]
            self.pinned_ints = _fit(self.pinned_ints, (sum(t.numel() for t in ints),))
            self.pinned_x = _fit(self.pinned_x, item.x.shape)
            host_ints, host_x = self.pinned_ints[:sum(t.numel() for t in ints)], self.pinned_x[:item.x.shape[0]]
            torch.cat(ints, out=host_ints)
            host_x.numpy()[...] = item.x
            device_ints = host_ints.to(self.device, non_blocking=True)
            x = host_x.to(self.device, non_blocking=True)
            parts = list(device_ints.split([t.numel() for t in ints]))
            if self.model.impl != "dgl":
                blocks = [Block.of_tensors(b.num_src, b.num_dst, parts[4 * i:4 * i + 4]) for i, b in enumerate(blocks)]
            owned = (device_ints, x, *(b.degree for b in blocks if isinstance(b, Block)))
            self.copied.record(self.stream)
        self.copied.synchronize()
        return DeviceInputs(blocks, x, parts[-1], owned)

    def claim(self, inputs: DeviceInputs) -> DeviceInputs:
        """In the training thread, before the step uses ``inputs``."""
        if self.cuda:
            compute = torch.cuda.current_stream(self.device)
            for tensor in inputs.owned:
                tensor.record_stream(compute)
        return inputs


def _fit(buffer: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``buffer`` if it holds ``shape`` (rows, ...), else a pinned one twice as large."""
    rows = shape[0] if shape else 0
    if buffer.shape[1:] == tuple(shape[1:]) and buffer.shape[0] >= rows:
        return buffer
    grown = max(rows, 2 * buffer.shape[0]) if buffer.shape[1:] == tuple(shape[1:]) else rows
    return torch.empty((grown, *shape[1:]), dtype=buffer.dtype, pin_memory=True)

