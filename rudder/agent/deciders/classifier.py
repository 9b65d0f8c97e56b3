"""The ``classifier`` decider (spec section 3): a model trained offline on collection-mode traces
(``rudder.agent.classifier_training``) decides "evict now?" from the same features the traces
hold (``rudder.agent.features``), computed from the same window metrics and facts, so training
and serving agree. The model files and their preprocessor are defined here, with the network of
the MLP baseline, since loading one needs both."""
from __future__ import annotations

import json
import os

import numpy as np

from rudder.agent.action import Action, ActionLimits
from rudder.agent.deciders.base import Decider, TrainerContext, refill_wait_impact, register_decider
from rudder.agent.features import FEATURES, features
from rudder.agent.protocol import EVICT, KEEP, Decision

MODELS = {"lr": "lr.joblib", "svm": "svm.joblib", "rf": "rf.joblib", "xgb": "xgb.json", "mlp": "mlp.pt"}
SEED = 1234  # the reference's model seed
PREPROCESSOR = "preprocessor.json"


class ClassifierError(ValueError):
    """A missing or unusable trace or model file (one line)."""


class MLP:
    """Spec 3.1's network: 128-128-64 (BN, ReLU, dropout 0.1) - 32 (ReLU) - 1 (sigmoid)."""

    @staticmethod
    def network(inputs: int):
        from torch import nn

        def block(i, o):
            return [nn.Linear(i, o), nn.BatchNorm1d(o), nn.ReLU(), nn.Dropout(0.1)]
        return nn.Sequential(*block(inputs, 128), *block(128, 128), *block(128, 64), nn.Linear(64, 32), nn.ReLU(),
                             nn.Linear(32, 1), nn.Sigmoid())

    def __init__(self, inputs: int):
        self.net = self.network(inputs)

    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int = 10) -> MLP:
        import torch

        torch.manual_seed(SEED)
        rng = np.random.default_rng(SEED)
        cut = max(1, int(0.1 * len(x)))  # a validation slice for the plateau schedule and early stop
        order = rng.permutation(len(x))
        val, fit = order[:cut], order[cut:]
        xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)[:, None]
        opt = torch.optim.AdamW(self.net.parameters(), lr=1e-4, weight_decay=1e-3)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=5)
        loss_fn, best, patience, best_state = torch.nn.BCELoss(), np.inf, 0, None
        for _ in range(epochs):
            self.net.train()
            for batch in np.array_split(rng.permutation(fit), max(1, -(-len(fit) // 128))):
                if len(batch) < 2:  # batch norm needs two rows
                    continue
                opt.zero_grad()
                loss_fn(self.net(xt[batch]), yt[batch]).backward()
                opt.step()
            self.net.eval()
            with torch.no_grad():
                v = float(loss_fn(self.net(xt[val]), yt[val]))
            sched.step(v)
            if v < best:
                best, patience, best_state = v, 0, {k: t.clone() for k, t in self.net.state_dict().items()}
            elif (patience := patience + 1) >= 10:
                break
        self.net.load_state_dict(best_state)
        self.net.eval()
        return self

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            p = self.net(torch.tensor(x, dtype=torch.float32))[:, 0].numpy()
        return np.stack([1 - p, p], axis=1)

    def save(self, path: str) -> None:
        import torch

        torch.save(self.net.state_dict(), path)

    @classmethod
    def load(cls, path: str, inputs: int) -> MLP:
        import torch

        m = cls(inputs)
        m.net.load_state_dict(torch.load(path, weights_only=True))
        m.net.eval()
        return m


def predict(model, x: np.ndarray) -> np.ndarray:
    """Evict (1) when p >= 0.5; the linear SVM has only a label."""
    if hasattr(model, "predict_proba"):
        return (model.predict_proba(x)[:, 1] >= 0.5).astype(np.int64)
    return model.predict(x).astype(np.int64)


def check_model_file(path: str) -> str:
    """The model kind of ``path``, or a one-line ClassifierError (no heavy imports: a start-up check)."""
    kind = next((k for k, name in MODELS.items() if os.path.basename(path) == name), None)
    if kind is None:
        raise ClassifierError(f"--classifier-model {path}: expected one of {', '.join(MODELS.values())} "
                              f"(written by python -m rudder.classifier train)")
    if not os.path.isfile(path):
        raise ClassifierError(f"--classifier-model {path}: no such file")
    pre = os.path.join(os.path.dirname(path), PREPROCESSOR)
    try:
        with open(pre) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise ClassifierError(f"--classifier-model {path}: cannot read {pre} beside it ({e})") from None
    if meta.get("features") != list(FEATURES):
        raise ClassifierError(f"--classifier-model {path}: trained on other features than this version computes "
                              f"(retrain with python -m rudder.classifier train)")
    return kind


def load_model(path: str):
    kind = check_model_file(path)
    with open(os.path.join(os.path.dirname(path), PREPROCESSOR)) as f:
        meta = json.load(f)
    if kind == "xgb":
        from xgboost import XGBClassifier
        model = XGBClassifier(n_jobs=1)
        model.load_model(path)
    elif kind == "mlp":
        model = MLP.load(path, len(FEATURES))
    else:
        import joblib
        model = joblib.load(path)
    return kind, model, np.array(meta["mean"]), np.array(meta["std"])


@register_decider("classifier")
class Classifier(Decider):
    def __init__(self, cfg, threads: int = 1):
        import torch

        super().__init__(cfg)
        torch.set_num_threads(1)
        self.kind, self.model, self.mean, self.std = load_model(cfg.agent.classifier_model)

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        check_model_file(cfg.agent.classifier_model)

    def decide(self, ctx: TrainerContext) -> Decision:
        """Logged: the standardised features as the prompt, the model's output as the answer."""
        x = (features(ctx.facts, ctx.latest, ctx.last_evicted) - self.mean) / self.std
        evict = bool(predict(self.model, x[None, :])[0])
        p = float(self.model.predict_proba(x[None, :])[0, 1]) if hasattr(self.model, "predict_proba") else None
        answer = {"model": self.kind, "decision": "evict" if evict else "keep", "p_evict": p}
        d = Decision(EVICT if evict else KEEP, explanation=f"{self.kind} says {'evict' if evict else 'keep'}",
                     prompt=json.dumps({"features": dict(zip(FEATURES, np.round(x, 4).tolist()))}))
        if self.cfg.agent.action == "structured":
            d.action = budget_of(evict, p, ctx)
            d.wait_impact = refill_wait_impact(d.action.refill, ctx.latest)
            answer["refill"] = d.action.refill
        d.raw = json.dumps(answer)
        return d


def budget_of(evict: bool, p_evict: float | None, ctx: TrainerContext) -> Action:
    """A classifier's yes/no as a refill budget: its label says whether a replacement of the
    paper's size would have paid off (the traces' label, ``classifier_training.labels``), so "keep"
    refills nothing and "evict" a share of the candidates the buffer has now, its confidence above
    the even odds: (2 p - 1) of them (all of them for the SVM, which gives no probability)."""
    limits = ActionLimits.of(ctx.facts)
    if not evict:
        return Action.budget(0, limits.window, limits.share)
    share = 1.0 if p_evict is None else min(1.0, max(0.0, 2 * p_evict - 1))
    rows = int(round(share * min(limits.refill, ctx.latest["candidates"])))
    return Action.budget(max(rows, 1) if limits.refill else 0, limits.window, limits.share)
