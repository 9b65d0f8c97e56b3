"""The classifier baselines (spec section 3): a model trained offline on traces decides "evict now?".

Three parts, one feature definition:

* **Collection** (``--policy fixed --collect-traces``): the trainer replaces every ``--delta``
  minibatches, and ``TraceCollector`` logs one row per replacement interval into the trainer's
  log (table ``classifier_trace``): the features as the agent would have seen them just before
  the replacement, the rows it evicted, and the mean hit rate, comm volume and re-fetch regret
  of the interval before ("pre") and after ("post") it (an interval's post is the next one's pre,
  as in the reference).
* **Training** (``python -m rudder.classifier train RUN... --out DIR``): label = 1 iff
  z(dHR) - z(dRefetch) - z(dComm) > 0, each delta post - pre and z-scored over all the traces
  (spec 3.3, with the re-fetch regret as Node_Freq and comm volume for T_rpc, which on a shared
  machine is noise); 80/20 stratified split (seed 42); LR, linear SVM, random forest, XGBoost
  and the MLP with the reference's hyperparameters (spec 3.1); the scaler goes to
  ``preprocessor.json``, each model to its own file.
* **Runtime** (``--policy classifier --classifier-model DIR/xgb.json``): the agent rank computes
  ``features()`` from the same window metrics and facts, so training and serving agree. The
  reference's train/serve skew (spec 3.4: interval index vs minibatch counter, evicted count
  always 0 at runtime, cumulative vs windowed rates) is fixed: every feature below is defined
  identically in both places, and Dataset one-hot is replaced by graph-size features, so a model
  can be run on a graph it never saw.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from rudder.agent import EVICT, KEEP, Decider, Decision, TrainerContext, register_decider, window_means

FEATURES = ("log_nodes", "log_edges", "num_parts", "log_batch_size", "log_halo", "capacity_fraction", "progress",
            "hitrate", "comm_per_seed", "candidate_fraction", "refetched_per_seed", "last_evicted_fraction")
PHASE = ("hitrate", "comm_volume", "refetched")  # what pre/post compare
TRACE_ROW = np.dtype([("interval", "i4"), ("minibatch", "i8"), *[(f, "f8") for f in FEATURES], ("evicted", "i8"),
                      *[(f"pre_{m}", "f8") for m in PHASE], *[(f"post_{m}", "f8") for m in PHASE]])
MODELS = {"lr": "lr.joblib", "svm": "svm.joblib", "rf": "rf.joblib", "xgb": "xgb.json", "mlp": "mlp.pt"}
SEED = 1234  # the reference's model seed
PREPROCESSOR = "preprocessor.json"


class ClassifierError(Exception):
    """A missing or unusable trace or model file (one line)."""


def features(facts: dict, latest: dict, last_evicted: float) -> np.ndarray:
    """The model's input: static facts of the trainer, the latest window's means (``latest``:
    counter plus ``WINDOW_METRICS``) and the size of the most recent replacement."""
    capacity, batch = max(facts["capacity"], 1), max(facts["batch_size"], 1)
    return np.array([
        np.log1p(facts["num_nodes"]), np.log1p(facts["num_edges"]), facts["num_parts"], np.log1p(facts["batch_size"]),
        np.log1p(facts["halo"]), facts["capacity"] / max(facts["halo"], 1),
        latest["counter"] / max(facts["total_minibatches"], 1),
        latest["hitrate"], latest["comm_volume"] / batch, latest["candidates"] / capacity,
        latest["refetched"] / batch, last_evicted / capacity,
    ], dtype=np.float64)


# -- collection ----------------------------------------------------------------------------------
class TraceCollector:
    """Fed every minibatch of a fixed-policy run; logs a row when an interval's post phase ends
    (at the next replacement; the run's last, unfinished interval is not logged)."""

    def __init__(self, facts: dict, window: int, log):
        self.facts, self.window, self.log = facts, window, log
        self.metrics: list[dict] = []  # since the last replacement (its interval's post phase)
        self.recent: list[dict] = []  # the last ``window`` minibatches
        self.open = None  # the interval awaiting its post phase
        self.interval, self.last_evicted = 0, 0

    def observe(self, view, replaced: bool, refills: int) -> None:
        from rudder.policies import window_metrics

        m = window_metrics(view)
        self.metrics.append(m)
        self.recent = (self.recent + [m])[-self.window:]
        if not replaced:
            return
        phase = {k: float(np.mean([x[k] for x in self.metrics])) for k in PHASE}
        if self.open is not None:
            self.log.append("classifier_trace", self.open + tuple(phase[k] for k in PHASE))
        latest = {"counter": view.counter, **window_means(self.recent)}
        x = features(self.facts, latest, self.last_evicted)
        self.open = (self.interval, view.counter, *x.tolist(), refills, *(phase[k] for k in PHASE))
        self.interval += 1
        self.last_evicted = refills or self.last_evicted  # as the agent keeps it
        self.metrics = []


# -- training ------------------------------------------------------------------------------------
def load_traces(runs: list[str]) -> np.ndarray:
    from rudder.analyze import load_run

    tables = []
    for run in runs:
        found = [r.classifier_trace for r in load_run(run).ranks if r.classifier_trace is not None]
        if not found:
            raise ClassifierError(f"{run}: no classifier_trace in its logs (collect with --policy fixed --collect-traces)")
        tables += found
    return np.concatenate(tables)


def labels(trace: np.ndarray) -> np.ndarray:
    """1 iff z(dHR) - z(dRefetch) - z(dComm) > 0 over the whole trace (spec 3.3's offline label)."""
    def z(name):
        d = trace[f"post_{name}"] - trace[f"pre_{name}"]
        sd = d.std()
        return (d - d.mean()) / (sd if sd > 0 else 1.0)
    return (z("hitrate") - z("refetched") - z("comm_volume") > 0).astype(np.int64)


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

    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int = 10) -> "MLP":
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
    def load(cls, path: str, inputs: int) -> "MLP":
        import torch

        m = cls(inputs)
        m.net.load_state_dict(torch.load(path, weights_only=True))
        m.net.eval()
        return m


def make_model(kind: str):
    if kind == "lr":
        from sklearn.linear_model import LogisticRegression
        return LogisticRegression(solver="lbfgs", max_iter=2000, class_weight="balanced")
    if kind == "svm":
        from sklearn.svm import LinearSVC
        return LinearSVC(C=1.0, class_weight="balanced", max_iter=5000)
    if kind == "rf":
        from sklearn.ensemble import RandomForestClassifier
        return RandomForestClassifier(n_estimators=300, max_depth=None, min_samples_leaf=5,
                                      class_weight="balanced_subsample", random_state=SEED, n_jobs=1)
    if kind == "xgb":
        from xgboost import XGBClassifier
        return XGBClassifier(n_estimators=500, max_depth=6, learning_rate=0.05, subsample=0.8, colsample_bytree=0.8,
                             reg_lambda=1.0, tree_method="hist", objective="binary:logistic", random_state=SEED, n_jobs=1)
    return None  # mlp: built on fit


def predict(model, x: np.ndarray) -> np.ndarray:
    """Evict (1) when p >= 0.5; the linear SVM has only a label."""
    if hasattr(model, "predict_proba"):
        return (model.predict_proba(x)[:, 1] >= 0.5).astype(np.int64)
    return model.predict(x).astype(np.int64)


def save_model(kind: str, model, path: str) -> None:
    if kind == "xgb":
        model.save_model(path)
    elif kind == "mlp":
        model.save(path)
    else:
        import joblib
        joblib.dump(model, path)


def train(runs: list[str], out: str, kinds: list[str], seed: int = 42) -> dict:
    """Train ``kinds`` on the traces of ``runs``; writes the preprocessor, the models and a report."""
    from sklearn.model_selection import train_test_split

    trace = load_traces(runs)
    y = labels(trace)
    x = np.stack([trace[f] for f in FEATURES], axis=1)
    if min(np.bincount(y, minlength=2)) < 2:
        raise ClassifierError(f"{', '.join(runs)}: {len(y)} trace rows but fewer than 2 of one label "
                              f"(collect longer runs, or more configurations)")
    mean, std = x.mean(axis=0), x.std(axis=0)
    std[std == 0] = 1.0
    xs = (x - mean) / std
    x_train, x_test, y_train, y_test = train_test_split(xs, y, test_size=0.2, stratify=y, random_state=seed)
    os.makedirs(out, exist_ok=True)
    report = {"runs": [os.path.abspath(r) for r in runs], "rows": int(len(y)), "evict_labels": float(y.mean()),
              "train_rows": int(len(y_train)), "test_rows": int(len(y_test)), "models": {}}
    for kind in kinds:
        t = time.perf_counter()
        model = MLP(len(FEATURES)).fit(x_train, y_train) if kind == "mlp" else make_model(kind).fit(x_train, y_train)
        seconds = time.perf_counter() - t
        guess = predict(model, x_test)
        save_model(kind, model, os.path.join(out, MODELS[kind]))
        report["models"][kind] = {"file": MODELS[kind], "test_accuracy": float((guess == y_test).mean()),
                                  "test_evict_share": float(guess.mean()), "train_seconds": seconds}
    with open(os.path.join(out, PREPROCESSOR), "w") as f:
        json.dump({"format": "rudder-classifier", "version": 1, "features": list(FEATURES), "mean": mean.tolist(),
                   "std": std.tolist(), "label": "z(dHR) - z(dRefetch) - z(dComm) > 0", **report}, f, indent=1)
    return report


def evaluate(model_dir: str, runs: list[str], kinds: list[str] | None = None) -> dict:
    """Accuracy of the models in ``model_dir`` on the traces of ``runs`` (labelled over those
    traces alone): the unseen-configuration test when ``runs`` were not trained on."""
    trace = load_traces(runs)
    y = labels(trace)
    x = np.stack([trace[f] for f in FEATURES], axis=1)
    out = {"runs": [os.path.abspath(r) for r in runs], "rows": int(len(y)), "evict_labels": float(y.mean()), "models": {}}
    for kind in kinds or list(MODELS):
        path = os.path.join(model_dir, MODELS[kind])
        if not os.path.exists(path):
            continue
        _, model, mean, std = load_model(path)
        guess = predict(model, (x - mean) / std)
        out["models"][kind] = {"accuracy": float((guess == y).mean()), "evict_share": float(guess.mean())}
    return out


# -- runtime -------------------------------------------------------------------------------------
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
    def __init__(self, cfg):
        import torch

        super().__init__(cfg)
        torch.set_num_threads(1)
        self.kind, self.model, self.mean, self.std = load_model(cfg.classifier_model)

    def decide(self, ctx: TrainerContext) -> Decision:
        """Logged: the standardised features as the prompt, the model's output as the answer."""
        x = (features(ctx.facts, ctx.latest, ctx.last_evicted) - self.mean) / self.std
        evict = bool(predict(self.model, x[None, :])[0])
        p = float(self.model.predict_proba(x[None, :])[0, 1]) if hasattr(self.model, "predict_proba") else None
        answer = json.dumps({"model": self.kind, "decision": "evict" if evict else "keep", "p_evict": p})
        return Decision(EVICT if evict else KEEP, explanation=f"{self.kind} says {'evict' if evict else 'keep'}",
                        raw=answer, prompt=json.dumps({"features": dict(zip(FEATURES, np.round(x, 4).tolist()))}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rudder.classifier",
                                 description="Train the classifier baselines on collection-mode traces.")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on the classifier_trace tables of runs made with --policy fixed --collect-traces")
    t.add_argument("runs", nargs="+", help="run directories of collection-mode runs")
    t.add_argument("--out", required=True, help="directory for preprocessor.json and the model files")
    t.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)} (default all)")
    t.add_argument("--seed", type=int, default=42, help="seed of the 80/20 split (default 42)")
    e = sub.add_parser("evaluate", help="accuracy of trained models on other runs' traces (unseen configurations)")
    e.add_argument("models_dir", help="the --out directory of a train command")
    e.add_argument("runs", nargs="+", help="collection-mode run directories")
    e.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args(argv)
    kinds = [k for k in args.models.split(",") if k]
    unknown = [k for k in kinds if k not in MODELS]
    if unknown or not kinds:
        print(f"rudder.classifier: error: --models {args.models}: expected a subset of {','.join(MODELS)}", file=sys.stderr)
        return 2
    from rudder.analyze import AnalysisError

    try:
        if args.command == "evaluate":
            report = evaluate(args.models_dir, args.runs, kinds)
            print(f"{report['rows']} trace rows ({report['evict_labels']:.0%} labelled evict)")
            print(f"{'model':6} {'accuracy':>8} {'evict share':>11}")
            for kind, r in report["models"].items():
                print(f"{kind:6} {r['accuracy']:8.3f} {r['evict_share']:11.2f}")
            return 0
        report = train(args.runs, args.out, kinds, args.seed)
    except (ClassifierError, AnalysisError) as e:
        print(f"rudder.classifier: error: {e}", file=sys.stderr)
        return 2
    print(f"{report['rows']} trace rows ({report['evict_labels']:.0%} labelled evict); "
          f"train {report['train_rows']}, test {report['test_rows']}; models in {args.out}")
    print(f"{'model':6} {'test acc':>8} {'evict share':>11} {'train s':>8}")
    for kind, r in report["models"].items():
        print(f"{kind:6} {r['test_accuracy']:8.3f} {r['test_evict_share']:11.2f} {r['train_seconds']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
