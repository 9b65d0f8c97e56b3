"""The classifiers' reported accuracies recomputed from the runs' raw trace rows, independently of
the training code: the spec's label z(dHR) - z(dRefetch) - z(dComm) > 0 over the traces scored,
the saved model's predictions, and for the held-out share the same stratified split (its seed is
recorded in preprocessor.json)."""
from __future__ import annotations

import os

import numpy as np
from conftest import read_logs

from rudder.agent.deciders.classifier import MODELS, load_model, predict
from rudder.agent.features import FEATURES


def traces(runs: list[str]) -> np.ndarray:
    return np.concatenate([r["classifier_trace"] for run in runs for r in read_logs(run) if r["role"] == "trainer"])


def labelled(trace: np.ndarray, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    def z(name):
        d = trace[f"post_{name}"] - trace[f"pre_{name}"]
        return (d - d.mean()) / (d.std() or 1.0)

    y = (z("hitrate") - z("refetched") - z("comm_volume") > 0).astype(int)
    x = np.stack([trace[f] for f in FEATURES], axis=1)
    return (x - np.array(meta["mean"])) / np.array(meta["std"]), y


def accuracy(model_dir: str, kind: str, x: np.ndarray, y: np.ndarray) -> float:
    _, model, _, _ = load_model(os.path.join(model_dir, MODELS[kind]))
    return float((predict(model, x) == y).mean())


def held_out_accuracy(model_dir: str, kind: str, meta: dict) -> float:
    """Accuracy on the 20% of the training runs' rows held out (``meta``: preprocessor.json)."""
    from sklearn.model_selection import train_test_split

    x, y = labelled(traces(meta["runs"]), meta)
    _, x_test, _, y_test = train_test_split(x, y, test_size=0.2, stratify=y, random_state=meta["split_seed"])
    return accuracy(model_dir, kind, x_test, y_test)


def unseen_accuracy(model_dir: str, kind: str, meta: dict, runs: list[str]) -> float:
    """Accuracy on other runs' rows, labelled over those rows alone."""
    x, y = labelled(traces(runs), meta)
    return accuracy(model_dir, kind, x, y)
