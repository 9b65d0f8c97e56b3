"""rudder.train.optimizer.Adam is torch.optim.Adam without torch._dynamo: the same parameters after
every step, bit for bit (a parameter without a gradient skipped, as torch skips it), state dicts
that load into each other, and a training job's modules that never import the compiler."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

from rudder.train.model import GraphSAGE
from rudder.train.optimizer import Adam


def models(seed=0):
    torch.manual_seed(seed)
    ours = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def step(model, opt, x, frozen=False):
    opt.zero_grad(set_to_none=False)
    model(x).square().sum().backward()
    if frozen:  # the last bias gets no gradient this step
        model[2].bias.grad = None
    opt.step()


def through_a_file(state):
    """As a checkpoint carries it (rudder.logs.checkpoints saves with torch.save)."""
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


def same(a, b):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("lr", [0.003, 0.1])
def test_every_step_is_torch_adams(lr):
    ours, theirs = models()
    opt, ref = Adam(ours.parameters(), lr=lr), torch.optim.Adam(theirs.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1)
    for k in range(12):
        x = torch.randn(7, 6, generator=gen)
        step(ours, opt, x, frozen=k == 3)
        step(theirs, ref, x, frozen=k == 3)
        same(ours, theirs)
    assert int(opt.state[3]["step"]) == 11 and int(opt.state[0]["step"]) == 12  # index 3: the skipped bias


def test_state_dicts_load_into_each_other():
    ours, theirs = models()
    opt, ref = Adam(ours.parameters(), lr=0.01), torch.optim.Adam(theirs.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(4, 6, generator=gen)
        step(ours, opt, x)
        step(theirs, ref, x)
    resumed, resumed_ref = models(seed=5)
    resumed.load_state_dict(ours.state_dict())
    resumed_ref.load_state_dict(theirs.state_dict())
    opt2, ref2 = Adam(resumed.parameters(), lr=0.01), torch.optim.Adam(resumed_ref.parameters(), lr=0.01)
    opt2.load_state_dict(through_a_file(ref.state_dict()))  # torch's checkpoint into ours, ours into torch
    ref2.load_state_dict(through_a_file(opt.state_dict()))
    for _ in range(3):
        x = torch.randn(4, 6, generator=gen)
        for model, o in ((ours, opt), (theirs, ref), (resumed, opt2), (resumed_ref, ref2)):
            step(model, o, x)
    same(ours, theirs)
    same(resumed, ours)
    same(resumed_ref, ours)
    with pytest.raises(ValueError, match="expected one group of 2 parameters"):
        Adam(torch.nn.Linear(2, 2).parameters(), lr=0.1).load_state_dict(opt.state_dict())


def test_graphsage_trains_as_with_torch_adam():
    torch.manual_seed(0)
    ours = torch.nn.ModuleList([GraphSAGE(8, 16, 4, 2, 0.0, "torch")])
    theirs = torch.nn.ModuleList([GraphSAGE(8, 16, 4, 2, 0.0, "torch")])
    theirs.load_state_dict(ours.state_dict())
    opt, ref = Adam(ours.parameters(), lr=0.003), torch.optim.Adam(theirs.parameters(), lr=0.003)
    for model, o in ((ours, opt), (theirs, ref)):
        for p in model.parameters():
            p.grad = torch.full_like(p, 0.5)
        o.step()
    same(ours, theirs)


def test_a_training_job_never_imports_the_compiler():
    code = ("import sys, torch\nimport rudder.train.job\nfrom rudder.train.optimizer import Adam\n"
            "m = torch.nn.Linear(3, 2)\no = Adam(m.parameters(), lr=0.1)\nm(torch.ones(1, 3)).sum().backward()\n"
            "o.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\nprint('torch._dynamo' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
