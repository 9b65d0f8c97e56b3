"""The run config: defaults < --config file < flags, and one-line errors naming what is wrong."""
from __future__ import annotations

import json

import pytest

from rudder.train.config import ConfigError, TrainConfig, parse_config


def test_precedence_and_types(tmp_path):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text('epochs = 7\nfanouts = "5,6"\nlr = 1\nhidden = 32\ntrace = true\n')
    cfg = parse_config(["--config", str(cfg_file), "--data", "d", "--run-dir", "r", "--hidden", "64"])
    assert (cfg.training.epochs, cfg.sampling.fanouts, cfg.model.lr, cfg.model.hidden, cfg.output.trace) == (7, [5, 6], 1.0,
                                                                                                             64, True)
    assert isinstance(cfg.model.lr, float) and cfg.data.path.startswith("/")
    again = TrainConfig.from_flat(json.loads(cfg.to_json()))  # the logged JSON rebuilds the same config
    assert again == cfg
    js = tmp_path / "run.json"
    js.write_text(json.dumps({"data": "d", "run_dir": "r", "fanouts": [3, 4, 5], "eval_every": 0}))
    assert parse_config(["--config", str(js)]).sampling.fanouts == [3, 4, 5]


def test_paper_defaults_and_batch_rule():
    cfg = parse_config(["--data", "d", "--run-dir", "r"])
    assert (cfg.sampling.fanouts, cfg.model.hidden, cfg.model.lr, cfg.model.dropout, cfg.training.epochs,
            cfg.training.eval_every) == ([10, 25], 16, 0.003, 0.5, 100, 5)
    assert (cfg.model.impl, cfg.model.device, cfg.model.gpu_allreduce) == ("torch", "cpu", "auto")
    assert cfg.resolved_batch_size(100_000) == 2000  # the paper's batch on big partitions
    assert cfg.resolved_batch_size(140) == 35 and cfg.resolved_batch_size(20) == 16  # >= 4 steps on small ones
    cfg.sampling.batch_size = 64
    assert cfg.resolved_batch_size(140) == 64


@pytest.mark.parametrize("argv,needle", [
    (["--run-dir", "r"], "--data"),
    (["--data", "d", "--run-dir", "r", "--epochs", "0"], "--epochs 0"),
    (["--data", "d", "--run-dir", "r", "--fanouts", "10,0"], "--fanouts"),
    (["--data", "d", "--run-dir", "r", "--fanouts", "a"], "--fanouts"),
    (["--data", "d", "--run-dir", "r", "--dropout", "1.5"], "--dropout"),
    (["--data", "d", "--run-dir", "r", "--device", "tpu"], "--device"),
    (["--data", "d", "--run-dir", "r", "--model-impl", "pyg"], "--model-impl"),
    (["--data", "d", "--run-dir", "r", "--gpu-allreduce", "nccl"], "--gpu-allreduce"),
    (["--data", "d", "--run-dir", "r", "--partition-mode", "x"], "--partition-mode"),
    (["--data", "d", "--run-dir", "r", "--bogus"], "--bogus"),
    (["--data", "d", "--run-dir", "r", "--policy", "lru"], "--policy"),
    (["--data", "d", "--run-dir", "r", "--buffer-fraction", "2"], "--buffer-fraction"),
    (["--data", "d", "--run-dir", "r", "--compat", "yes"], "--compat"),
    (["--data", "d", "--run-dir", "r", "--buffer-sharing", "node"], "--partition-mode node"),
    (["--data", "d", "--run-dir", "r", "--buffer-sharing", "node", "--partition-mode", "node", "--policy", "lookahead"],
     "--buffer-sharing"),
    (["--data", "d", "--run-dir", "r", "--policy", "none", "--buffer-init", "vip"], "there is no buffer"),
    (["--data", "d", "--run-dir", "r", "--policy", "lookahead", "--buffer-init", "vip"], "fills on demand"),
    (["--data", "d", "--run-dir", "r", "--buffer-init", "lru"], "--buffer-init"),
    (["--data", "d", "--run-dir", "r", "--policy", "fixed", "--refill-budget", "0"], "--refill-budget 0"),
    (["--data", "d", "--run-dir", "r", "--policy", "fixed", "--refill-budget", "1.5"], "--refill-budget 1.5"),
    (["--data", "d", "--run-dir", "r", "--policy", "tuner", "--refill-budget", "0.5"], "only with --policy fixed"),
])
def test_bad_flags(argv, needle):
    with pytest.raises(ConfigError) as e:
        parse_config(argv)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text,needle", [
    ("epochs = 'x'", "expected an integer"),
    ("speed = 3", "unknown key 'speed'"),
    ("epochs = [", "not valid TOML"),
])
def test_bad_config_file(tmp_path, text, needle):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        parse_config(["--config", str(path), "--data", "d", "--run-dir", "r"])
    assert needle in str(e.value) and str(path) in str(e.value)
    with pytest.raises(ConfigError, match="cannot read"):
        parse_config(["--config", str(tmp_path / "none.toml")])


def test_options_reference_is_the_declarations():
    """docs/options.md is made from the declarations (python -m rudder.train.config), so it lists
    every option with its default and help; a flag added without regenerating it fails here."""
    from conftest import REPO

    from rudder.train.config import options_reference, parser

    with open(f"{REPO}/docs/options.md") as f:
        assert f.read() == options_reference(), "regenerate: python -m rudder.train.config > docs/options.md"
    flags = {s for a in parser()._actions for s in a.option_strings if s.startswith("--")} - {"--help", "--config"}
    assert all(f"`{flag}`" in options_reference() for flag in flags)
