"""The committed LANL table is the release's, its lifetimes are censored as documented, and
`ckptsim fit` gives the LANL and Titan studies' numbers."""

from pathlib import Path

import numpy as np
import pytest

from simulator.fitting import lanl, titan
from simulator.fitting.fit import fit_lifetime

_ROOT = Path(__file__).resolve().parents[1]
_REL = "shared/data/lanl/LA-UR-05-7318-failure-data-1996-2005.csv.xz"
# The shared data sit beside the checkout (../shared), or beside a worktree's parent.
SOURCE = next((p / _REL for p in (_ROOT.parent, _ROOT.parent.parent) if (p / _REL).exists()),
              _ROOT.parent / _REL)  # fmt: skip


def test_the_table_holds_every_released_failure_with_its_cause():
    table = lanl.load_table()
    assert len(table) == 23_739
    counts = table.cause.value_counts()
    # The release's README counts by category.
    assert counts["Hardware"] == 14_341 and counts["Software"] == 5_361
    assert counts["Undetermined"] == 2_652 and counts["Human Error"] == 149


@pytest.mark.skipif(not SOURCE.exists(), reason="the released LANL file is not on this machine")
def test_the_committed_table_is_rebuilt_exactly_from_the_release(tmp_path):
    import pandas as pd

    rebuilt = tmp_path / "t.csv"
    lanl.build_table(SOURCE).to_csv(rebuilt, index=False)
    pd.testing.assert_frame_equal(pd.read_csv(rebuilt), lanl.load_table())


def test_every_node_ends_censored_and_never_failed_nodes_are_counted():
    table = lanl.load_table()
    nl = lanl.node_lifetimes(table, 20)
    assert nl.nodes_seen + nl.nodes_never_failed == 512
    # One censored lifetime per node: its last failure to decommission, or a whole life.
    assert int((~nl.observed).sum()) == 512
    assert nl.observed.sum() == table[table.system == 20].groupby("node").start.nunique().sum()


def test_the_hazard_shape_is_measured_not_assumed():
    nl = lanl.node_lifetimes(lanl.load_table(), 18)
    w = fit_lifetime(nl.durations_s, nl.observed, "weibull")
    # Dropping the censored tails (a common mistake) moves the shape: the censoring matters.
    naive = fit_lifetime(nl.durations_s[nl.observed], np.ones(nl.observed.sum(), bool), "weibull")
    lo, hi = w.ci95["shape"]
    assert not lo <= naive.params["shape"] <= hi
    assert w.params["shape"] < 1


def test_system_failure_times_are_the_distinct_starts_of_any_node():
    from experiments.lanl_fit import system_failure_times

    table = lanl.load_table()
    t = system_failure_times(table, 18)
    assert t[0] == 0 and np.all(np.diff(t) > 0)
    assert t.size == table.loc[table.system == 18, "start"].nunique()


def _cli_fit_equals_study_fit(durations_s, observed, tmp_path, capsys):
    """``ckptsim fit --json`` on a lifetimes log ranks and fits as ``fit_all`` does."""
    import json

    import pandas as pd

    from simulator.cli import main
    from simulator.fitting.fit import fit_all

    log = tmp_path / "lifetimes.csv"
    pd.DataFrame({"duration": durations_s, "event": observed.astype(int)}).to_csv(
        log, index=False, float_format="%.17g"
    )
    assert main(["fit", str(log), "--unit", "s", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    study = fit_all(durations_s, observed)
    assert got["events"] == int(observed.sum()) and got["censored"] == int((~observed).sum())
    assert [f["family"] for f in got["families"]] == [f.family for f in study]
    for row, f in zip(got["families"], study, strict=True):
        assert row["aic"] == pytest.approx(f.aic, rel=1e-9)
        for k, v in f.params.items():
            assert row["params"][k] == pytest.approx(v, rel=1e-6)


def test_ckptsim_fit_on_a_lanl_system_gives_the_study_numbers(tmp_path, capsys):
    nl = lanl.node_lifetimes(lanl.load_table(), 20)
    _cli_fit_equals_study_fit(nl.durations_s, nl.observed, tmp_path, capsys)


def test_ckptsim_fit_on_the_titan_gpus_gives_the_titan_study_numbers(tmp_path, capsys):
    # experiments/titan_fit.py fits fit_all(*titan.gpu_lifetimes()): 18,688 slots' first events.
    from simulator.fitting import titan

    durations_s, observed = titan.gpu_lifetimes()
    _cli_fit_equals_study_fit(durations_s, np.asarray(observed, bool), tmp_path, capsys)


@pytest.mark.skipif(
    not titan.SOURCE_CSV.exists(), reason="the published Titan gc_full.csv is not on this machine"
)
def test_the_raw_titan_file_exported_by_the_study_fits_to_the_reports_numbers(tmp_path, capsys):
    """gc_full.csv holds a GPU's periods and events on rows of their own, not one lifetime per
    unit: `fit` refuses it in one line, and the study's export of it fits to its numbers."""
    import json

    from experiments import titan_fit
    from simulator.cli import main

    raw = titan.SOURCE_CSV
    assert main(["fit", str(raw)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "row 7138" in err and "blank" in err
    out = tmp_path / "titan-lifetimes.csv"
    assert titan_fit.main(["--source", str(raw), "--lifetimes-out", str(out)]) == 0
    capsys.readouterr()
    assert main(["fit", str(out), "--unit", "s", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    d, o = titan.gpu_lifetimes()  # the committed table experiments/titan_fit.py fits
    assert got["events"] == int(o.sum()) and got["censored"] == int((~o).sum())
    assert got["best"] == "weibull"
    shape = next(f for f in got["families"] if f["family"] == "weibull")["params"]["shape"]
    study = fit_lifetime(d, o, "weibull")
    assert shape == pytest.approx(study.params["shape"], rel=1e-6)
    report = (Path(__file__).resolve().parents[1] / "reports" / "titan-fit.md").read_text()
    assert f"shape = {shape:.4g} (" in report


def test_fit_on_the_committed_system20_log_differs_from_the_study_by_the_dates_it_lacks(capsys):
    """The README's account of why `ckptsim fit experiments/logs/lanl-system20.csv` is not
    reports/lanl-fit.md's system 20: the log has no production or decommission dates, so each
    node's first failure (timed from production in the study) is no lifetime, its last gap is
    censored at the log's last failure, and nodes that never failed are not in it."""
    import json

    from experiments import example_log
    from simulator.cli import main

    nl = lanl.node_lifetimes(lanl.load_table(), example_log.SYSTEM)
    assert main(["fit", str(example_log.OUT), "--cause-column", "none", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert nl.before_production == 0 and got["components"] == nl.nodes_seen == 400
    assert int(nl.observed.sum()) == got["events"] + nl.nodes_seen  # 2,474 = 2,074 + 400
    # The study censors every seen node at its decommission and adds the never-failed ones;
    # the log censors at its last failure, which one node's last gap ends at.
    assert int((~nl.observed).sum()) == nl.nodes_seen + nl.nodes_never_failed == 512
    assert got["censored"] == nl.nodes_seen - 1
    shape = next(f for f in got["families"] if f["family"] == "weibull")["params"]["shape"]
    study = fit_lifetime(nl.durations_s, nl.observed, "weibull").params["shape"]
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    text = " ".join(readme.split())
    assert f"Weibull shape {shape:.3f} against the report's {study:.3f}" in text
