"""The run config: defaults < --config file < flags, and one-line errors naming what is wrong."""
from __future__ import annotations

import json

import numpy as np
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
    (["--data", "d", "--run-dir", "r", "--buffer-sharing", "node", "--buffer-scope", "remote"],
     "halo with --buffer-sharing node and --partition-mode trainer"),
    (["--data", "d", "--run-dir", "r", "--buffer-sharing", "node", "--partition-mode", "node", "--policy", "lookahead"],
     "--buffer-sharing"),
    (["--data", "d", "--run-dir", "r", "--buffer-split", "quota"], "expected pool, unless --buffer-sharing node"),
    (["--data", "d", "--run-dir", "r", "--buffer-split", "half"], "--buffer-split"),
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


@pytest.mark.parametrize("shift,needle", [
    ("2", "not EPOCH:KEY=VALUE"),
    ("x:fanouts=5,5", "not EPOCH:KEY=VALUE"),
    ("2:fanout=5,5", "KEY one of fanouts, batch, seeds"),
    ("2:fanouts=5", "fanouts of 2 layers"),
    ("2:fanouts=5,0", "fanouts='5,0'"),
    ("2:batch=-3", "batch='-3'"),
    ("2:seeds=0", "seeds='0'"),
    ("2:seeds=degree-high", "all or a fraction"),
    ("2:batch=8;batch=9", "batch given twice"),
    ("0:batch=8", "from 1 on"),
    ("3:batch=8 2:batch=4", "must increase"),
    ("9:batch=8", "epoch 9 is never trained"),
])
def test_bad_shift(shift, needle):
    with pytest.raises(ConfigError) as e:
        parse_config(["--data", "d", "--run-dir", "r", "--epochs", "5", "--shift", shift])
    message = str(e.value)
    assert message.startswith("--shift ") and needle in message and "\n" not in message, message


def test_shift_phases_and_their_steps():
    """Each shift keeps what it does not name; steps per epoch are the phase's, and the minibatch
    counter runs on across phases (what checkpoints and policies count by)."""
    cfg = parse_config(["--data", "d", "--run-dir", "r", "--epochs", "5", "--batch-size", "10",
                        "--shift", "2:fanouts=5,5;seeds=0.5 4:batch=0"])
    settings = cfg.phase_settings()
    assert [(p.first_epoch, p.fanouts, p.batch_setting, p.seed_fraction) for p in settings] == [
        (0, (10, 25), 10, 1.0), (2, (5, 5), 10, 0.5), (4, (5, 5), 0, 0.5)]
    phases = cfg.run_phases([100, 50, 50])
    assert [(p.batch_size, p.steps_per_epoch) for p in phases.phases] == [(10, 10), (10, 5), (16, 4)]
    assert [phases.steps(e) for e in range(5)] == [10, 10, 5, 5, 4] and phases.total == 34
    assert [phases.counter(e, 0) for e in range(5)] == [0, 10, 20, 25, 30]
    assert [phases.position(c) for c in (0, 19, 20, 24, 25, 33, 34)] == [(0, 0), (1, 9), (2, 0), (2, 4), (3, 0), (4, 3),
                                                                         (5, 0)]
    unshifted = parse_config(["--data", "d", "--run-dir", "r", "--epochs", "5", "--batch-size", "10"]).run_phases([100])
    assert len(unshifted.phases) == 1 and unshifted.total == 50 and unshifted.position(37) == (3, 7)


def test_phase_seeds_are_nested_and_keyed_by_seed():
    from rudder.sampling.phases import phase_seeds

    train = np.arange(1000, 1101)
    half, quarter = phase_seeds(0, 3, train, 0.5), phase_seeds(0, 3, train, 0.25)
    assert half.size == 50 and quarter.size == 25 and np.isin(quarter, half).all()
    assert (np.diff(half) > 0).all() and np.isin(half, train).all()
    assert not np.array_equal(half, phase_seeds(1, 3, train, 0.5)) and phase_seeds(0, 3, train, 1.0) is train
