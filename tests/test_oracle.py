"""The hindsight oracle (bench/evaluation/sweep.py, oracle.py) without training: a grid's [oracle]
table expands into one labelled run per fixed setting, each with flags the trainer accepts; bad
tables are one line naming the key; from a synthetic results table the best fixed setting is
picked by epoch time and by rows separately, the steered policies are stated against it and the
better static, and [targets.oracle] is checked where it applies (congested vs steady). The
smoke grid bench/grids/oracle-tiny.toml and the agent grid load. A setting run twice (identical
options but for bookkeeping) is found and its spread stated beside the targets. With repeats, each
steered run is paired with the oracle's and the static's run of its own round."""
from __future__ import annotations

import os

import pytest
from conftest import REPO

from bench.evaluation.grid import GridError, load_grid, policy_flags, steered
from bench.evaluation.harness import setting_of
from bench.evaluation.oracle import hindsight, oracle_section, oracle_targets, steady
from bench.evaluation.report import policy_table
from bench.evaluation.sweep import settings
from rudder.train.config import parse_config
from rudder.train.options import to_flat

GRID = """
[datasets]
a = "bundled:cora"
[grid]
ranks = [2]
fractions = [0.25]
policies = ["none", "static", "static-vip", "fixed", "heuristic", "tuner"]
"""
ORACLE = """
[oracle]
delta = [4, 8]
refill = [1.0, 0.25]
scope = ["halo", "remote"]
lookahead = [2, 4]
"""


TRAIN = ["--data", "parts", "--run-dir", "run"]  # what the harness adds to a run's flags


def write(tmp_path, text):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return str(path)


def test_the_sweep_expands_into_one_labelled_run_per_setting(tmp_path):
    grid = load_grid(write(tmp_path, GRID + ORACLE))
    labels = [s.label(0.25) for s in settings(grid)]
    assert len(labels) == 2 * 2 * 2 + 2 * 2 == len(set(labels))
    assert labels[:2] == ["sweep-fixed-d4-b1-halo-f0.25", "sweep-fixed-d4-b1-remote-f0.25"]
    assert "sweep-fixed-d8-b0.25-remote-f0.25" in labels and labels[-1] == "sweep-lookahead-w4-remote-f0.25"
    for s in settings(grid):  # every setting's flags are the trainer's own options, meaning what the label says
        cfg = parse_config([*TRAIN, *s.flags(0.25)]).buffer
        assert (cfg.policy, cfg.fraction, cfg.scope) == (s.policy, 0.25, s.scope)
        if s.policy == "fixed":
            assert (cfg.delta, cfg.refill_budget) == (s.delta, s.refill)
        else:
            assert cfg.lookahead == s.window
    assert settings(load_grid(write(tmp_path, GRID))) == []  # no [oracle]: no sweep
    vip = parse_config([*TRAIN, *policy_flags(grid, "static-vip", 0.25, None)]).buffer
    assert (vip.policy, vip.init, vip.fraction) == ("static", "vip", 0.25)


VARIANT = """
[variants]
tuner-window = { policy = "tuner", flags = ["--agent-action", "structured", "--agent-buffer", "window"] }
"""


def test_a_grid_variant_is_a_run_of_its_own_and_an_agent_variant_is_steered(tmp_path):
    grid = load_grid(write(tmp_path, GRID.replace('"tuner"]', '"tuner", "tuner-window"]') + VARIANT + ORACLE))
    cfg = parse_config([*TRAIN, *policy_flags(grid, "tuner-window", 0.25, None)])
    assert (cfg.buffer.policy, cfg.agent.action, cfg.agent.buffer, cfg.buffer.fraction) == ("tuner", "structured", "window", 0.25)
    assert steered(grid, "tuner-window") and steered(grid, "llm") and not steered(grid, "static-vip")
    runs = {**RUNS, "tuner-window-f0.25": fig(1.7, 300)}
    o = hindsight(grid, runs, 0.25)
    assert set(o["steered"]) == {"heuristic", "tuner", "llm", "tuner-window"} and o["strongest"] == "tuner-window"
    assert "tuner-window" not in hindsight(load_grid(write(tmp_path, GRID + ORACLE)), runs, 0.25)["steered"]


@pytest.mark.parametrize("table, expected", [
    ("[oracle]\ndelta = [4, 0]\n", "[oracle] delta must be a list of periods"),
    ("[oracle]\ndelta = [4]\nrefill = [1.5]\n", "[oracle] refill must be a list of fractions"),
    ("[oracle]\ndelta = [4]\nscope = ['node']\n", "[oracle] scope must be a list"),
    ("[oracle]\ndelta = [4]\nwindow = [2]\n", "[oracle] unknown key 'window'"),
    ("[oracle]\nscope = ['halo']\n", "[oracle] needs delta or lookahead"),
    ("[oracle]\ndelta = 4\n", "[oracle] delta must be a list"),
    ("[targets.oracle]\nover_oracle = 0.95\n", "[targets.oracle] needs an [oracle] table"),
    ("[oracle]\ndelta = [4]\n[targets.oracle]\nover_best = 0.95\n", "[targets.oracle] 'over_best' must be one of"),
    ("[variants]\nfixed = { policy = 'fixed' }\n", "names no policy"),
    ("[variants]\nstatic-vip = { policy = 'static' }\n", "names no policy"),
    ("[variants]\nsweep-x = { policy = 'fixed' }\n", "names no policy"),
    ("[variants]\nBig = { policy = 'fixed' }\n", "lowercase letters"),
    ("[variants]\nx = { policy = 'none' }\n", "policy must be one of static"),
    ("[variants]\nx = { policy = 'classifier' }\n", "policy must be one of"),
    ("[variants]\nx = { policy = 'fixed', flags = '--delta 2' }\n", "flags must be a list of strings"),
    ("[variants]\nx = { policy = 'fixed', flag = [] }\n", "must be { policy"),
    ("[variants]\nx = 3\n", "must be { policy"),
])
def test_a_bad_oracle_or_variants_table_is_one_line(tmp_path, table, expected):
    path = write(tmp_path, GRID + table)
    with pytest.raises(GridError) as e:
        load_grid(path)
    assert expected in str(e.value) and path in str(e.value) and "\n" not in str(e.value)


def fig(epoch, rows, **decisions):
    return {"epoch_seconds": epoch, "rows_per_epoch": rows, **({"decisions": decisions} if decisions else {})}


RUNS = {"none": fig(3.0, 900), "static-f0.25": fig(2.4, 700), "static-vip-f0.25": fig(2.2, 650),
        "fixed-f0.25": {**fig(2.3, 500), "setting": "d4"},  # the sweep's d4-b1-halo run twice
        "lookahead-f0.25": {**fig(2.5, 300), "min_rows": 1080},  # traced runs carry MIN's rows (all epochs)
        "sweep-fixed-d4-b1-halo-f0.25": {**fig(2.1, 450), "setting": "d4"},
        "sweep-fixed-d8-b0.25-remote-f0.25": {**fig(2.0, 600), "rows_all_epochs": 2400},
        "sweep-lookahead-w2-halo-f0.25": {**fig(2.6, 280), "min_rows": 1000},
        "heuristic-f0.25": fig(1.9, 520, invalid_rate=0.0, latency_p50=0.01,
                                pass_at_1={"comm": {"value": 0.5, "low": 0.4, "high": 0.6},
                                           "wait": {"value": 0.25, "low": 0.1, "high": 0.5}}),
        "tuner-f0.25": fig(1.8, 610), "llm-f0.25": fig(2.05, 500, invalid_rate=0.0, latency_p50=1.5),
        "static-f0.05": fig(1.0, 1)}  # another fraction: never compared with 0.25's


def test_the_hindsight_best_is_picked_by_time_and_by_rows_separately(tmp_path):
    grid = load_grid(write(tmp_path, GRID + ORACLE))
    o = hindsight(grid, RUNS, 0.25)
    assert o["settings"] == 5  # the sweep's three and the grid's own fixed and lookahead runs
    assert o["by_time"] == {"setting": "sweep-fixed-d8-b0.25-remote", "epoch_seconds": 2.0, "rows_over_min": 2.4}
    assert o["min_rows"] == 1000  # the least MIN of the traced runs at this fraction
    assert o["repeats"] == [{"labels": ["fixed", "sweep-fixed-d4-b1-halo"], "epoch_seconds": [2.3, 2.1],
                             "spread": pytest.approx(2.3 / 2.1)}]
    assert o["by_rows"] == {"setting": "sweep-lookahead-w2-halo", "rows_per_epoch": 280}
    assert o["better_static"] == "static-vip" and o["vip_over_degree_rows"] == pytest.approx(650 / 700)
    assert set(o["steered"]) == {"heuristic", "tuner", "llm"} and o["strongest"] == "tuner"
    t = o["steered"]["tuner"]
    assert t["over_oracle"] == pytest.approx(0.9) and t["over_static"] == pytest.approx(1.8 / 2.2)
    assert t["rows_over_oracle"] == pytest.approx(610 / 280)
    assert o["steered"]["llm"]["latency_p50"] == 1.5 and o["steered"]["heuristic"]["pass_at_1"]["wait"]["high"] == 0.5
    untraced = {k: {**v, "min_rows": None} for k, v in RUNS.items()}
    assert hindsight(grid, untraced, 0.25)["min_rows"] is None  # no trace, no bound
    without_sweep = {k: v for k, v in RUNS.items() if not k.startswith("sweep-")}
    assert hindsight(grid, without_sweep, 0.25) is None  # the grid's fixed run alone is no oracle
    # a tie goes to the first in the table, and a run without a figure is no candidate
    tied = {**RUNS, "sweep-fixed-d4-b1-halo-f0.25": fig(2.0, None)}
    assert hindsight(grid, tied, 0.25)["by_time"]["setting"] == "sweep-fixed-d4-b1-halo"
    assert hindsight(grid, tied, 0.25)["by_rows"]["setting"] == "sweep-lookahead-w2-halo"


def configs(congestion="none", runs=RUNS, shift=None):
    net = {"rate": "1gbit", "links": "shared", "congestion": congestion}
    config = {"dataset": "a", "ranks": 2, "network": net, **({"shift": shift} if shift else {})}
    return {"a-p2": {"config": config, "runs": runs}}


def test_the_targets_hold_the_strongest_steered_policy_where_they_apply(tmp_path):
    grid = load_grid(write(tmp_path, GRID + ORACLE + "[targets.oracle]\nover_oracle = 0.95\nover_static = 0.9\n"
                                                     "steady_over_oracle = 1.02\n"))
    congested = oracle_targets(grid, configs("square:600mbit,period=2"))
    assert congested == [
        "- a-p2, f=0.25: the strongest steered policy (tuner) over the hindsight-best fixed setting "
        "(sweep-fixed-d8-b0.25-remote) met: 0.90x (target <= 0.95x); identical runs differed by up to 1.10x",
        "- a-p2, f=0.25: the strongest steered policy (tuner) over the better static (static-vip) "
        "met: 0.82x (target <= 0.9x); identical runs differed by up to 1.10x"]
    calm = oracle_targets(grid, configs())
    assert calm == ["- a-p2, f=0.25 (steady): the strongest steered policy (tuner) over the hindsight-best fixed "
                    "setting (sweep-fixed-d8-b0.25-remote) met: 0.90x (target <= 1.02x); identical runs differed by up "
                    "to 1.10x"]
    slow = {**RUNS, "tuner-f0.25": fig(2.5, 610), "heuristic-f0.25": fig(2.3, 1), "llm-f0.25": fig(2.2, 1)}
    assert "NOT met: 1.10x (target <= 1.02x)" in oracle_targets(grid, configs(runs=slow))[0]
    assert steady(configs()["a-p2"]["config"]) and not steady(configs(shift="at=0.5")["a-p2"]["config"])
    assert steady({**configs()["a-p2"]["config"], "shift": ""})  # a grid's steady run: its shifts' ""
    assert not steady(configs("square:1gbit,period=1")["a-p2"]["config"]) and steady({"network": None})
    assert oracle_targets(load_grid(write(tmp_path, GRID + ORACLE)), configs()) == []  # no [targets.oracle]


def test_the_report_section_states_every_steered_policy(tmp_path):
    grid = load_grid(write(tmp_path, GRID + ORACLE))
    lines = oracle_section(grid, configs())
    assert lines[2] == ("| a-p2 | 0.25 | yes | 5 | sweep-fixed-d8-b0.25-remote | 2.000 | sweep-lookahead-w2-halo | 280 "
                        "| 2.400 | 2.200 | 700 | 650 | 0.929 | 1,000 | 2.400 |")
    assert "- a-p2, f=0.25: fixed 2.300 s, sweep-fixed-d4-b1-halo 2.100 s (1.095x)" in lines
    rows = [line for line in lines if line.startswith("| a-p2 | 0.25 | ") and line.count("|") == 13]
    assert [r.split(" | ")[2] for r in rows] == ["heuristic", "tuner", "llm"]
    assert rows[0] == ("| a-p2 | 0.25 | heuristic | 1.900 | 0.950 | 0.864 (static-vip) | 520 | 1.857 | 0.000 | 0.010 "
                       "| 0.500 [0.40, 0.60] | 0.250 [0.10, 0.50] |")
    assert rows[2].endswith("| 0.000 | 1.500 | - | - |")
    assert oracle_section(grid, configs(runs={k: v for k, v in RUNS.items() if not k.startswith("sweep")})) == []


@pytest.mark.parametrize("name", ["agent.toml", "agent-facebook.toml", "oracle-tiny.toml"])
def test_the_oracle_grids_load(name):
    grid = load_grid(os.path.join(REPO, "bench", "grids", name))
    assert settings(grid) and {"static", "static-vip", "heuristic", "tuner", "llm"} <= set(grid["grid"]["policies"])
    assert {"none", "square"} <= {c.partition(":")[0] for c in grid["network"]["congestion"]}
    assert set(grid["targets"]["oracle"]) == {"over_oracle", "over_static", "steady_over_oracle"}


def test_the_policy_table_names_a_sweep_run_by_its_setting():
    runs = {label: {**f, "hit_percent": 1.0, "test_acc": 0.5} for label, f in RUNS.items()}
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1] for line in policy_table({"runs": runs}, [0.25])[2:]}
    assert rows["sweep-fixed-d8-b0.25-remote"] == "0.25" and rows["static-vip"] == "0.25" and rows["none"] == "-"



def test_a_setting_is_every_option_but_bookkeeping():
    """Runs that differ only in what they record (run directory, traces, progress) are one setting."""
    flat = to_flat(parse_config(TRAIN + ["--policy", "fixed", "--delta", "8"]))  # as a run's log records it
    twin = {**flat, "run_dir": "elsewhere", "trace": True, "collect_traces": True, "progress": "none"}
    assert setting_of(flat) == setting_of(twin)
    assert setting_of(flat) != setting_of({**flat, "delta": 4})


def repeated_fig(seconds: dict, rows: int) -> dict:
    """A setting run in several rounds ({round: epoch seconds}): its median run's figures, as the harness keeps them."""
    times = list(seconds.values())
    return {**fig(sorted(times)[(len(times) - 1) // 2], rows),
            "repeats": {"runs": [f"r.rep{k}" for k in seconds], "rounds": list(seconds), "epoch_seconds": times}}


def test_with_repeats_each_steered_run_is_paired_with_the_oracles_run_of_its_round(tmp_path):
    """The host slows between rounds: the median runs compare a fast round's oracle with a slow
    round's steered run, the paired ratios do not, and the targets judge their median."""
    grid = load_grid(write(tmp_path, GRID + ORACLE + "[targets.oracle]\nover_oracle = 0.95\nover_static = 0.9\n"))
    runs = {"static-f0.25": repeated_fig({1: 2.0, 2: 3.0, 3: 3.1}, 700),
            "static-vip-f0.25": repeated_fig({1: 2.1, 2: 3.2, 3: 3.3}, 650),
            "sweep-fixed-d8-b0.25-remote-f0.25": repeated_fig({1: 1.0, 2: 1.5, 3: 1.6}, 600),
            "tuner-f0.25": repeated_fig({1: 0.9, 2: 1.6, 3: 1.4}, 610),
            "heuristic-f0.25": repeated_fig({2: 1.5}, 600)}  # one round only: no pairs
    o = hindsight(grid, runs, 0.25)
    t = o["steered"]["tuner"]
    assert t["over_oracle"] == pytest.approx(1.4 / 1.5)  # median runs: rounds 3 and 2
    assert t["paired_over_oracle"]["rounds"] == [1, 2, 3]
    assert t["paired_over_oracle"]["ratios"] == pytest.approx([0.9, 1.6 / 1.5, 1.4 / 1.6])
    assert t["paired_over_oracle"]["median"] == pytest.approx(0.9)
    assert o["better_static"] == "static" and t["paired_over_static"]["median"] == pytest.approx(1.4 / 3.1)
    assert o["steered"]["heuristic"]["paired_over_oracle"] is None
    lines = oracle_section(grid, configs(runs=runs))
    assert ("| a-p2 | 0.25 | tuner | 0.900 | 1: 0.900, 2: 1.067, 3: 0.875 | 0.452 | 1: 0.450, 2: 0.533, 3: 0.452 |"
            in lines)
    assert not any("| heuristic | " in line and line.count("|") == 8 for line in lines)
    (over_oracle, _) = oracle_targets(grid, configs("square:600mbit,period=2", runs=runs))
    assert over_oracle.startswith("- a-p2, f=0.25: the strongest steered policy (tuner) over the hindsight-best fixed "
                                  "setting (sweep-fixed-d8-b0.25-remote) met: 0.90x (target <= 0.95x) (paired by round, "
                                  "the median of 3: 0.90, 1.07, 0.87)")
