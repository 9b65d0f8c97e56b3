"""The trainer's Adam: torch's own update (``torch.optim.adam.adam``, the function
``torch.optim.Adam.step`` calls) on state kept here, without ``torch.optim.Optimizer``.

Why not ``torch.optim.Adam`` itself: ``Optimizer`` wraps ``add_param_group``, ``zero_grad`` and
``step`` so that each imports ``torch._dynamo`` (the compiler) on first use. Every rank would pay
for that import at start-up about what it pays for torch itself (docs/training.md), and on a
cluster every rank would read the compiler's modules from the shared filesystem at once. Nothing
in a run compiles.

The state and the ``state_dict`` are ``torch.optim.Adam``'s (a step tensor, ``exp_avg`` and
``exp_avg_sq`` per parameter, one parameter group), and the update is the same call with the same
arguments: the parameters after each step are bit-identical to ``torch.optim.Adam``'s, and a
checkpoint written by either loads into the other (tests/test_optimizer.py).
"""
from __future__ import annotations

import torch
from torch.optim.adam import adam

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the trainer always used
EPS = 1e-8


class Adam:
    """Adam over ``params`` with learning rate ``lr``, no weight decay, no amsgrad."""

    def __init__(self, params, lr: float):
        self.params = list(params)
        if not self.params:
            raise ValueError("Adam: an empty parameter list")
        self.group = {"lr": lr, "betas": BETAS, "eps": EPS, "weight_decay": 0, "amsgrad": False, "maximize": False,
                      "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                      "decoupled_weight_decay": False}
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient, as ``torch.optim.Adam.step``."""
        index = [i for i, p in enumerate(self.params) if p.grad is not None]
        for i in index:
            if i not in self.state:  # as Adam._init_group: a CPU float step, zero moments
                p = self.params[i]
                self.state[i] = {"step": torch.tensor(0.0, dtype=torch.get_default_dtype()),
                                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                                 "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
        g = self.group
        adam([self.params[i] for i in index], [self.params[i].grad for i in index],
             [self.state[i]["exp_avg"] for i in index], [self.state[i]["exp_avg_sq"] for i in index], [],
             [self.state[i]["step"] for i in index], amsgrad=False,
             has_complex=any(torch.is_complex(self.params[i]) for i in index), beta1=g["betas"][0],
             beta2=g["betas"][1], lr=g["lr"], weight_decay=g["weight_decay"], eps=g["eps"], maximize=False,
             foreach=g["foreach"], capturable=False, differentiable=False, fused=g["fused"], grad_scale=None,
             found_inf=None, decoupled_weight_decay=False)

    def state_dict(self) -> dict:
        """``torch.optim.Adam.state_dict()``'s layout: state by parameter index, one group."""
        return {"state": {i: dict(s) for i, s in self.state.items()},
                "param_groups": [{**self.group, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"Adam.load_state_dict: expected one group of {len(self.params)} parameters, got "
                             f"{[len(g['params']) for g in groups]}")
        position = {index: k for k, index in enumerate(groups[0]["params"])}
        state = {}
        for index, s in state_dict["state"].items():
            p = self.params[position[int(index)]]
            if s["exp_avg"].shape != p.shape:
                raise ValueError(f"Adam.load_state_dict: parameter {index} has shape {tuple(p.shape)}, the state "
                                 f"{tuple(s['exp_avg'].shape)}")
            state[position[int(index)]] = {"step": s["step"].detach().clone().to("cpu", torch.get_default_dtype()),
                                           "exp_avg": s["exp_avg"].detach().to(p.device, p.dtype).clone(),
                                           "exp_avg_sq": s["exp_avg_sq"].detach().to(p.device, p.dtype).clone()}
        self.state = state
        self.group.update({k: v for k, v in groups[0].items() if k in self.group})
