"""The closed-loop report: tables and figures from ``study.run_study``'s results, nothing typed in.

Every number in ``reports/closed-loop.md`` is computed here from the measured runs and the
simulator's predictions; the method is stated next to each table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from simulator.engines.results import goal_verdict, mean_ci, outward

__all__ = ["summarise", "write_report"]

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
"""One marker per policy in the prediction figure: colour alone must not tell series apart."""


def summarise(study: dict) -> dict:
    """The headline comparisons: prediction error, adaptive vs best fixed and vs the default.

    Each comparison is made twice: on the measured wall time, and on the *speed-adjusted* wall
    time — the measured run with its useful compute (the same deterministic steps in every run)
    timed at the study's pooled seconds per step instead of the run's own. The machine's speed
    drifts by several per cent from one minute to the next whatever the policy; the adjustment
    takes that drift out and leaves every second a policy can change (lost work, saves,
    restarts, start-up) as measured.
    """
    df = pd.DataFrame(study["rows"])
    df["adj_s"] = df.wall_s - df.useful_s + study["steps"] * study["pooled"].step_s
    labels = list(study["specs"])
    fixed = [k for k in labels if study["specs"][k]["kind"] in ("fixed", "steps")]
    default = next(k for k in labels if study["specs"][k]["kind"] == "steps")
    adaptive = next(k for k in labels if study["specs"][k]["kind"] == "adaptive")
    out = dict(df=df, labels=labels, default=default, adaptive=adaptive)
    # "sim": each run replayed with the pooled parameters and the kills it met — the same
    # comparison at exactly one machine speed, with the interval choice as the only difference.
    for name, column in (("raw", "wall_s"), ("adj", "adj_s"), ("sim", "replay_s")):
        table = df.pivot(index="repeat", columns="label", values=column)[labels]
        best = min(fixed, key=lambda k: table[k].mean())
        out[name] = dict(
            table=table, best=best,
            vs_best=table[adaptive] / table[best] - 1.0,
            vs_default=table[adaptive] / table[default] - 1.0,
        )  # fmt: skip
    exp = study["expected"]
    out["mean_err"] = {k: exp[k]["mean_s"] / out["raw"]["table"][k].mean() - 1.0 for k in labels}
    out["adj_mean_err"] = {
        k: exp[k]["mean_s"] / out["adj"]["table"][k].mean() - 1.0 for k in labels
    }
    return out


def _pm(x: pd.Series | np.ndarray, scale: float = 100.0, fmt: str = "{:+.1f}") -> str:
    x = np.asarray(x, float) * scale
    if x.size < 2:
        return fmt.format(x.mean())
    return f"{fmt.format(x.mean())} ± {x.std(ddof=1):.1f}"


def _ci(x: pd.Series | np.ndarray) -> str:
    """'+1.2 % (95 % CI -0.3 to +2.7)' for fractions."""
    mean, lo, hi = mean_ci(np.asarray(x, float) * 100)
    if np.isnan(lo):
        return f"{mean:+.1f} %"
    low, high = (t if t.startswith("-") else "+" + t for t in outward(lo, hi, ".1f"))
    return f"{mean:+.1f} % (95 % CI {low} to {high})"  # the bounds rounded outward


def plot(study: dict, s: dict, figdir: Path, stem: str = "closed-loop") -> list[Path]:
    """The two figures, named after the report (``<stem>-prediction.png``, ``-policies``)."""
    figdir.mkdir(parents=True, exist_ok=True)
    return [
        prediction_figure(s["df"], s["labels"], figdir / f"{stem}-prediction.png"),
        policies_figure(study["expected"], s["df"], s["labels"], figdir / f"{stem}-policies.png"),
    ]


def prediction_figure(df, labels, path: Path, *, simulator="simulator", events="kills") -> Path:
    """Each run's replay (filled: its own parameters, hollow: pooled) against its measured wall
    time, over a ±5 % band; the tiered study draws its runs with the same function."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    lo = min(df.wall_s.min(), df.replay_s.min(), df.own_s.min()) * 0.95
    hi = max(df.wall_s.max(), df.replay_s.max(), df.own_s.max()) * 1.05
    # The band and the diagonal go underneath (zorder), so no run is hidden behind them; each
    # policy has its own marker, half-transparent, so runs that coincide still show.
    ax.fill_between(
        [lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.92", zorder=0,
        label="±5 % of measured",
    )  # fmt: skip
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, zorder=1)
    for i, label in enumerate(labels):
        d = df[df.label == label]
        m = MARKERS[i % len(MARKERS)]
        ax.scatter(
            d.wall_s, d.own_s, label=label, color=f"C{i}", marker=m, s=32, alpha=0.75, zorder=3
        )
        ax.scatter(
            d.wall_s, d.replay_s, facecolors="none", edgecolors=f"C{i}", marker=m, s=32,
            zorder=3,
        )  # fmt: skip
    ax.set(xlabel="measured wall time (s)", ylabel=f"{simulator}, same {events} (s)")
    ax.set(xlim=(lo, hi), ylim=(lo, hi))
    ax.legend(fontsize=6, loc="upper left")
    ax.set_title(
        f"{simulator.capitalize()} replay vs measured run (grey band: ±5 %)\n"
        "filled: the run's own parameters, hollow: pooled parameters",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def policies_figure(expected: dict, df, labels, path: Path, *, events="kills") -> Path:
    """Wall time per policy, measured and speed-adjusted: one line per repeat (the same
    failures) and the simulator's mean with the sd of a mean of the repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    x = np.arange(len(labels))
    means = [expected[k]["mean_s"] for k in labels]
    sds = [expected[k]["sd_s"] / np.sqrt(df.repeat.nunique()) for k in labels]
    for ax, column, title in (
        (axes[0], "wall_s", "measured"),
        (axes[1], "adj_s", "speed-adjusted (useful compute at the pooled speed)"),
    ):
        for r in sorted(df.repeat.unique()):
            d = df[df.repeat == r].set_index("label").loc[labels]
            ax.plot(
                x, d[column], "o-", lw=0.6, ms=4, color="0.5",
                label=f"one line per repeat (same {events})" if r == 0 else None,
            )  # fmt: skip
        ax.errorbar(
            x + 0.15, means, yerr=sds, fmt="s", color="C3",
            label="simulator mean (± sd of a mean of the repeats)",
        )  # fmt: skip
        ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=7)
        ax.set_title(f"Wall time per policy: {title}", fontsize=9)
    axes[0].set_ylabel("wall time (s)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


FIGURE_COLUMNS = ("label", "repeat", "wall_s", "own_s", "replay_s", "adj_s")


def save_figure_data(study: dict, s: dict, path: Path, columns=FIGURE_COLUMNS) -> Path:
    """What the figures draw, per run, so ``--render-only`` can redraw them."""
    import json

    data = dict(
        labels=s["labels"],
        expected={k: study["expected"][k] for k in s["labels"]},
        runs=s["df"][list(columns)].to_dict(orient="records"),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=float) + "\n", encoding="utf-8")
    return path


def render_figures(path: Path, figdir: Path, stem: str, draw=None) -> list[Path]:
    """Redraw the figures (``draw``, default :func:`plot`) from :func:`save_figure_data`'s
    file, running nothing."""
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    s = dict(df=pd.DataFrame(data["runs"]), labels=data["labels"])
    return (draw or plot)(dict(expected=data["expected"]), s, figdir, stem)


def write_report(
    study: dict, out: Path, figdir: Path, *, command: str, elapsed_s: float | None
) -> Path:
    """Write the markdown report and its figures; ``elapsed_s`` None: runs were reused."""
    s = summarise(study)
    figs = plot(study, s, figdir, out.stem)
    save_figure_data(study, s, out.parent / "data" / f"{out.stem}-runs.json")
    cfg, p0, p, df = study["cfg"], study["pilot"], study["pooled"], s["df"]
    clock = (
        "an exponential"
        if cfg.weibull_shape is None
        else f"a Weibull (shape {cfg.weibull_shape:g})"
    )
    reps = df.repeat.nunique()
    load = study.get("load")
    load_text = (
        f"The machine ({load['cpus']} CPUs) was shared with other work: 1-minute load average "
        f"{load['start']:.1f} at the start and {load['end']:.1f} at the end."
        if load
        else "The machine's load during the runs was not recorded."
    )
    L = [
        "# Closed loop: real training runs with injected failures",
        "",
        f"Generated by `{command}` "
        + (
            f"in {elapsed_s / 60:.1f} min"
            if elapsed_s is not None
            else "from the runs already in its work directory"
        )
        + f"; the runs took {study.get('runs_span_s', float('nan')) / 60:.1f} min from the "
        "pilot's first launch to the last job's exit (supervisor logs). Do not edit by hand.",
        "",
        "## Method",
        "",
        f"- Job: a {_params(cfg)} GPT-style model (torch `TransformerEncoderLayer` blocks with a "
        "causal mask) trained on a corpus the project generates "
        "(`experiments/crashtest/corpus.py`),"
        f" one CPU thread per process, {study['steps']} useful steps, checkpointed by "
        "`simulator.controller.AdaptiveCheckpointer` (weights, AdamW, LR schedule; sync saves).",
        f"- Failures: the supervisor SIGKILLs the process when its lifetime is up — {clock} "
        f"clock with MTBF {cfg.mtbf_s:g} s, one lifetime per launch drawn up front with a seeded "
        "generator; the first launch's clock starts when it is training, every later one's at "
        f"process start, so kills also strike restarts. After a kill it waits "
        f"{cfg.restart_delay_s:g} s and relaunches; the job resumes from its newest checkpoint.",
        f"- Common random numbers: {reps} repeats, each one list of lifetimes that every policy "
        f"meets; {cfg.workers} jobs ran at once, in a shuffled order per repeat.",
        "- Accounting (from the job's JSONL events and the supervisor's log, one monotonic clock):"
        " wall = start-up + recovery + saving + useful + lost, each second in exactly one "
        "bucket; lost = compute after the last completed save of a launch that was killed.",
        f"- Machine parameters measured over all runs: {p.step_s * 1e3:.1f} ms per step, save "
        f"stall δ = {p.save_s:.3f} s, restart R = {p.restart_s:.2f} s (kill to training: delay, "
        f"interpreter + torch import, restore), first start-up {p.startup_s:.2f} s. The pilot "
        f"(one short job killed twice) measured {p0.step_s * 1e3:.1f} ms, {p0.save_s:.3f} s and "
        f"{p0.restart_s:.2f} s; the policies' intervals were set from it. {load_text}",
        "- Simulator: `simulator.engines.des_replicas.run_replica` with the run's own kill times "
        "(`failure_times`, extended with its schedule's later lifetimes) gives a per-run "
        f"*replay* prediction; `simulate` ({cfg.replicas} replicas over the clock) gives the "
        "*expected* wall time a user would be told up front. Both use the pooled parameters "
        "above and add the measured first start-up (the simulated job starts at work).",
        "- The closed-form τ* is `ExactOptimal` evaluated once on the pilot's δ and the clock's "
        "MTBF and run as a fixed interval (what `ckptsim optimize` would advise). The adaptive "
        "controller (`policy=None`) got the clock's MTBF as its prior and the pilot's R; it "
        "measures δ and the step time itself and updates the failure rate from its run log. "
        "(`policy=ExactOptimal()` inside the controller would run the same code path here: "
        "`Adaptive` without a component model is `ExactOptimal` on the live estimates.)",
        "",
        "## Results",
        "",
        "| policy | measured wall (s) | speed-adjusted wall (s) | simulator expected (s) |"
        " Daly closed form (s) | kills | lost steps | saving (s) | recovery (s) | ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    exp = study["expected"]
    for k in s["labels"]:
        d = df[df.label == k]
        daly = exp[k]["daly_s"]
        L.append(
            f"| {k} | {_pm(d.wall_s, 1.0, '{:.1f}')} | {_pm(d.adj_s, 1.0, '{:.1f}')} | "
            f"{exp[k]['mean_s']:.1f} (sd {exp[k]['sd_s']:.1f}) | "
            f"{'—' if np.isnan(daly) else f'{daly:.1f}'} | {d.failures.mean():.1f} | "
            f"{d.lost_steps.mean():.0f} | {d.saving_s.mean():.1f} | {d.recovery_s.mean():.1f} |"
            f" {d.step_s.mean() * 1e3:.1f} |"
        )
    err = df.replay_err * 100
    within = (err.abs() <= 5).mean() * 100
    own = df.own_err * 100
    own_within = (own.abs() <= 5).mean() * 100
    raw = s["raw"]["table"]
    se = raw.std(ddof=1) / np.sqrt(reps) / raw.mean()  # a measured mean's relative std error
    imports = np.concatenate([r["import_s"] for r in study["rows"]])
    restores = np.concatenate([r["restore_s"] for r in study["rows"]])
    L += [
        "",
        f"Means ± standard deviation over the {reps} repeats. *Speed-adjusted*: the measured "
        "run with its useful compute timed at the pooled "
        f"{p.step_s * 1e3:.1f} ms per step instead of its own (every run does the same "
        "deterministic steps, so their duration depends on the machine, not the policy: per-run "
        f"step times ranged {df.step_s.min() * 1e3:.1f}–{df.step_s.max() * 1e3:.1f} ms, and the "
        "ms/step column shows no policy ran systematically faster); lost work, saves, restarts "
        "and start-up stay as measured. *Simulator expected* is the Monte-Carlo mean (sd: spread "
        "of one run).",
        "",
        f"Where a restart's {p.restart_s:.1f} s went (means over all launches): the supervisor's "
        f"delay {cfg.restart_delay_s:g} s; interpreter start and imports (torch, "
        f"`simulator.controller`) {imports.mean():.1f} s; building the model and optimizer (the "
        "first AdamW constructed imports `torch._dynamo`) and restoring the "
        f"checkpoint {restores.mean():.2f} s.",
        "",
        "### Does the simulator predict the measured wall time?",
        "",
        f"- Replay with each run's own measured step time, save stall, restart and start-up "
        f"(same kills): error {_pm(df.own_err)} % (mean ± sd over {len(df)} runs), largest "
        f"{own.abs().max():.1f} %; {own_within:.0f} % of runs within ±5 % (goal: within 5 %).",
        f"- Replay with the pooled parameters (same kills): error {_pm(df.replay_err)} %, "
        f"largest {err.abs().max():.1f} %; {within:.0f} % of runs within ±5 %. The gap between "
        "the two replays is the machine's speed drift.",
        "- Expected (clock only: what a user is told before running anything) against the "
        "measured mean of each policy; the last column is the measured mean's own standard "
        "error (sd over √repeats — one run's spread is mostly how many kills it met):",
        "",
        "| policy | simulator / measured mean − 1 | simulator / speed-adjusted mean − 1 | "
        "standard error of the measured mean |",
        "|---|---|---|---|",
        *(
            f"| {k} | {v * 100:+.1f} % | {s['adj_mean_err'][k] * 100:+.1f} % | "
            f"± {se[k] * 100:.1f} % |"
            for k, v in s["mean_err"].items()
        ),
        "",
        "### Does the adaptive controller match the best fixed interval?",
        "",
        "Paired differences over the repeats (same kills), mean and Student's t 95 % interval:",
        "",
        "| wall time | best fixed in hindsight | adaptive vs best fixed | adaptive vs default "
        "| adaptive faster than default |",
        "|---|---|---|---|---|",
    ]
    names = {
        "raw": "measured",
        "adj": "speed-adjusted",
        "sim": "simulated replay, one speed",
    }
    for key, name in names.items():
        c = s[key]
        L.append(
            f"| {name} | {c['best']} | {_ci(c['vs_best'])} | {_ci(c['vs_default'])} | "
            f"{(c['vs_default'] < 0).sum()} of {len(c['vs_default'])} repeats |"
        )
    L += [
        "",
        f"The default saves every {study['specs'][s['default']]['every']} steps, Hugging Face "
        "Trainer's `save_steps`. The simulated "
        "replay runs `Adaptive` on the pooled δ and the clock's MTBF, so it shows what the "
        "interval choice is worth, not the live controller's learning.",
        "",
        "### Verdict",
        "",
        *verdict(s, df),
        "",
        "Per repeat, measured wall (s) / speed-adjusted (s):",
        "",
        "| repeat | " + " | ".join(s["labels"]) + " |",
        "|---" * (len(s["labels"]) + 1) + "|",
    ]
    raw, adj = s["raw"]["table"], s["adj"]["table"]
    for r in raw.index:
        cells = [f"{raw.loc[r, k]:.1f} / {adj.loc[r, k]:.1f}" for k in s["labels"]]
        L.append(f"| {r} | " + " | ".join(cells) + " |")
    L += ["", *[f"![{f.stem}](figures/{f.name})" for f in figs], ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L), encoding="utf-8")
    return out


def _judge_margin(diffs: pd.Series, limit: float) -> str:
    """Verdict on 'adaptive is at most ``limit`` worse': met only on the whole interval."""
    v = goal_verdict([mean_ci(diffs)], at_most=limit)
    return "met (the whole 95 % interval)" if v == "met" else _why(v)


def _judge_beats(diffs: pd.Series) -> str:
    """Verdict on 'adaptive is faster': met only when the whole interval is below zero."""
    mean, lo, hi = mean_ci(diffs)
    v = goal_verdict([(mean, lo, hi)], at_most=0.0)
    if v == "met" and hi == 0.0:  # an interval touching zero shows no gain
        v = "not shown"
    return "met (the whole 95 % interval below zero)" if v == "met" else _why(v)


def _why(v: str) -> str:
    if v == "not shown":
        return "not shown (the mean meets it, the 95 % interval does not)"
    return v


def verdict(s: dict, df: pd.DataFrame) -> list[str]:
    """The goals, each answered from the numbers above."""
    own = df.own_err.abs()
    adj_ok = sum(abs(v) <= 0.05 for v in s["adj_mean_err"].values())
    raw_ok = sum(abs(v) <= 0.05 for v in s["mean_err"].values())
    lines = [
        f"- Simulator within 5 % of the measured wall time: each run replayed with its own "
        f"measured parameters, mean error {_pm(df.own_err)} %, {(own <= 0.05).sum()} of "
        f"{len(df)} runs within 5 %; the Monte-Carlo expectation within 5 % of {raw_ok} of "
        f"{len(s['mean_err'])} measured policy means and {adj_ok} of {len(s['mean_err'])} "
        "speed-adjusted ones.",
    ]
    for key, name in (("raw", "measured"), ("adj", "speed-adjusted")):
        c = s[key]
        lines += [
            f"- Adaptive within 3 % of the best fixed interval ({name} wall): "
            f"{_ci(c['vs_best'])} — {_judge_margin(c['vs_best'], 0.03)}.",
            f"- Adaptive beats the default ({name} wall): {_ci(c['vs_default'])} — "
            f"{_judge_beats(c['vs_default'])}.",
        ]
    return lines


def _params(cfg) -> str:
    from experiments.crashtest.corpus import VOCAB
    from experiments.crashtest.model import GPTConfig, TinyGPT
    from experiments.crashtest.train_gpt import parse_args

    flags = [f"--{k.replace('_', '-')}={v}" for k, v in cfg.model_args.items()]
    a = parse_args(["--run-dir", ".", "--steps", "1", *flags])
    model = TinyGPT(
        GPTConfig(vocab_size=len(VOCAB), block_size=a.block, n_layer=a.n_layer, n_embd=a.n_embd)
    )
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f} M-parameter"
