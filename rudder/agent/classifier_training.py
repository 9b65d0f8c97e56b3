"""Training the classifier baselines (spec section 3) on collection-mode traces:

    python -m rudder.classifier train RUN [RUN ...] --out DIR [--models lr,svm,rf,xgb,mlp] [--seed 42]
    python -m rudder.classifier evaluate DIR RUN [RUN ...]

* **Collection** (``--policy fixed --collect-traces``, ``rudder.prefetch.trace_collection``): one
  ``classifier_trace`` row per replacement interval in the trainer's log.
* **Training**: label = 1 iff z(dHR) - z(dRefetch) - z(dComm) > 0, each delta post - pre and
  z-scored over all the traces (spec 3.3, with the re-fetch regret as Node_Freq and the
  communication volume for T_rpc, which on a shared machine is noise); 80/20 stratified split
  (seed 42); LR, linear SVM, random forest, XGBoost and the MLP with the reference's
  hyperparameters (spec 3.1); the scaler goes to ``preprocessor.json``, each model to its own file.
* **Evaluation** on other runs' traces: the unseen-configuration test.
* **Runtime** (``--policy classifier --classifier-model DIR/xgb.json``): ``rudder.agent.deciders.classifier``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from rudder.agent.deciders.classifier import MLP, MODELS, PREPROCESSOR, SEED, ClassifierError, load_model, predict
from rudder.agent.features import FEATURES
from rudder.logs.reader import LogError, load_run


def load_traces(runs: list[str]) -> np.ndarray:
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
    report = {"runs": [os.path.abspath(r) for r in runs], "split_seed": seed, "rows": int(len(y)),
              "evict_labels": float(y.mean()),
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
    try:
        if args.command == "evaluate":
            report = evaluate(args.models_dir, args.runs, kinds)
            print(f"{report['rows']} trace rows ({report['evict_labels']:.0%} labelled evict)")
            print(f"{'model':6} {'accuracy':>8} {'evict share':>11}")
            for kind, r in report["models"].items():
                print(f"{kind:6} {r['accuracy']:8.3f} {r['evict_share']:11.2f}")
            return 0
        report = train(args.runs, args.out, kinds, args.seed)
    except (ClassifierError, LogError) as e:
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
