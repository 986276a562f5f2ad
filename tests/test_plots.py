"""Plots: files are written, and the figures carry the artists they promise."""

from __future__ import annotations

import json
import re

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest

from simulator import optimize, plots
from simulator.cli import main
from simulator.errors import InputError
from simulator.model.scenario import Scenario

S = Scenario(
    gpus=1024, mtbf_h=2.0, checkpoint_s=300.0, restart_s=600.0, work_h=100.0, usd_per_gpu_hour=2.0
)


@pytest.fixture(scope="module")
def result():
    return optimize.optimize_by_simulation(
        S,
        replicas=30,
        seed=0,
        bootstrap=30,
        adaptive=False,
        baselines=("fixed-30min", "fixed-1h", "fixed-3h"),
    )


def test_interval_curve_draws_simulation_closed_form_optimum_and_defaults(result, tmp_path):
    ax = plots.interval_curve(result, S)
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(lbl.startswith("simulated") for lbl in labels)
    assert "closed form (Daly 2006)" in labels
    assert any(lbl.startswith("optimum") for lbl in labels)
    texts = {t.get_text() for t in ax.texts}
    assert {"every 30 min", "every 1 h", "every 3 h"} <= texts
    assert len(ax.collections) >= 1  # the confidence band
    paths = plots.save(ax, tmp_path / "curve")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert paths[1].read_text().lstrip().startswith("<?xml")


def test_breakdown_stacks_four_buckets_per_policy(tmp_path):
    df = pd.DataFrame(
        {
            "policy": ["a", "b", "c"],
            "useful_h": [10, 10, 10],
            "checkpoint_h": [1, 2, 3],
            "lost_h": [3, 2, 1],
            "recovery_h": [1, 1, 1],
        }
    )
    ax = plots.time_breakdown(df)
    assert len(ax.patches) == 12
    tops = [p.get_y() + p.get_height() for p in ax.patches[-3:]]
    assert tops == pytest.approx([15, 15, 15])
    plots.save(ax, tmp_path / "b")


def test_tornado_has_two_bars_per_input_ordered_by_span():
    df = pd.DataFrame({"input": ["x", "y"], "low_s": [500, 900], "high_s": [700, 1500]})
    ax = plots.tornado(df, 1000.0)
    assert len(ax.patches) == 4
    assert [t.get_text() for t in ax.get_yticklabels()] == ["x", "y"]


def test_size_and_cost_plots_draw_one_series_each(tmp_path):
    df = pd.DataFrame({"gpus": [1024, 4096, 16384], "interval_s": [3000, 1500, 750]})
    ax = plots.optimum_vs_size(df)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    rng = np.random.default_rng(0)
    ax = plots.cost_distribution({"a": rng.normal(5, 1, 50), "b": rng.normal(6, 1, 50)})
    assert len(ax.get_lines()) == 2  # one mean line per policy


def test_money_and_interval_legends_read_as_dollars_and_minutes(result):
    # A run's cost is tens of millions: matplotlib alone writes 4.98e+07 and "1e7" offsets.
    rng = np.random.default_rng(0)
    costs = {"optimum": rng.normal(4.98e7, 2e5, 200), "hourly": rng.normal(5.39e7, 2e5, 200)}
    ax = plots.cost_distribution(costs)
    ax.figure.canvas.draw()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    mean = costs["optimum"].mean()
    assert legend[0] == f"optimum (mean ${mean:,.0f})"
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(re.fullmatch(r"\$\d{1,3}(,\d{3})*", t) for t in ticks)
    assert ax.xaxis.get_offset_text().get_text() == ""
    ax = plots.interval_curve(result, S, metric="cost")
    ax.figure.canvas.draw()
    assert all(t.get_text().startswith("$") for t in ax.get_yticklabels() if t.get_text())
    sizes = pd.DataFrame({"gpus": [1024, 4096], "interval_s": [3000, 1500]})
    legend = plots.optimum_vs_size(sizes).get_legend().get_texts()
    assert "interval_s" not in " ".join(t.get_text() for t in legend)


@pytest.mark.parametrize("fmt", ["csv", "json", "jsonl"])
def test_controller_log_reads_csv_json_and_json_lines(tmp_path, fmt):
    rows = [
        {"step": 0, "time_s": 0.0, "interval_s": 1200.0},
        {"step": 50, "time_s": 3600.0, "interval_s": 900.0},
    ]
    path = tmp_path / f"log.{fmt}"
    if fmt == "csv":
        pd.DataFrame(rows).to_csv(path, index=False)
    elif fmt == "json":
        path.write_text(json.dumps({"records": rows}))
    else:
        path.write_text("\n".join(json.dumps(r) for r in rows))
    ax = plots.controller_intervals(path, reference_s={"Young": 1000.0})
    ys = ax.get_lines()[0].get_ydata()
    assert list(ys) == [20.0, 15.0]


def test_controller_log_without_interval_column_is_an_input_error(tmp_path):
    path = tmp_path / "log.csv"
    path.write_text("step,time_s\n1,2\n")
    with pytest.raises(InputError, match="interval_s"):
        plots.read_interval_log(path)


def test_cli_plot_writes_png_and_svg(tmp_path, capsys):
    log = tmp_path / "log.csv"
    log.write_text("step,time_s,interval_s\n0,0,1200\n10,600,1100\n")
    assert main(["plot", "controller", "--log", str(log), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c.png").exists() and (tmp_path / "c.svg").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["plot", "controller", "--out", "x"],
        ["plot", "size", "--sizes", "a", "--out", "x"],
        ["plot", "nonsense", "--out", "x"],
    ],
)
def test_cli_plot_bad_input_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_cli_plot_from_flags_alone_draws_that_job_not_the_default_preset(tmp_path, capsys):
    stem = tmp_path / "flags"
    argv = ["plot", "interval", "--gpus", "1024", "--gpu-mtbf-h", "50000", "--work-h", "100"]
    assert main([*argv, "--replicas", "4", "--out", str(stem)]) == 0
    svg = (tmp_path / "flags.svg").read_text()
    assert "<!-- command-line: waste against interval -->" in svg
    assert "llama3" not in svg


def test_the_plot_commands_default_policies_are_the_usual_intervals_defined_once():
    # The CLI spells them out so `ckptsim --help` need not import numpy; they must not drift.
    from simulator.cli import build_parser
    from simulator.policies import USUAL_INTERVALS

    args = build_parser().parse_args(["plot", "breakdown", "--out", "x"])
    fixed = [float(p.split(":")[1]) for p in args.policies.split(",") if p.startswith("fixed:")]
    assert fixed == [u.interval_s for u in USUAL_INTERVALS]
