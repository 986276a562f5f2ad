"""The closed-loop report: tables and figures from ``study.run_study``'s results, nothing typed in.

Every number in ``reports/closed-loop.md`` is computed here from the measured runs and the
simulator's predictions; the method is stated next to each table.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["summarise", "write_report"]


def summarise(study: dict) -> dict:
    """The headline comparisons: prediction error, adaptive vs best fixed and vs the default."""
    df = pd.DataFrame(study["rows"])
    labels = list(study["specs"])
    fixed = [k for k in labels if study["specs"][k]["kind"] in ("fixed", "steps")]
    default = next(k for k in labels if study["specs"][k]["kind"] == "steps")
    adaptive = next(k for k in labels if study["specs"][k]["kind"] == "adaptive")
    wall = df.pivot(index="repeat", columns="label", values="wall_s")[labels]
    best = min(fixed, key=lambda k: wall[k].mean())
    vs_best = wall[adaptive] / wall[best] - 1.0
    vs_default = wall[adaptive] / wall[default] - 1.0
    # The same comparison at one machine speed: each run replayed by the simulator with the
    # pooled parameters and the kills it met (policy-independent, so CRN holds exactly).
    sim = df.pivot(index="repeat", columns="label", values="replay_s")[labels]
    best_sim = min(fixed, key=lambda k: sim[k].mean())
    exp = study["expected"]
    mean_err = {k: exp[k]["mean_s"] / wall[k].mean() - 1.0 for k in labels}
    return dict(
        df=df, wall=wall, labels=labels, best=best, default=default, adaptive=adaptive,
        vs_best=vs_best, vs_default=vs_default, mean_err=mean_err, best_sim=best_sim,
        sim_vs_best=sim[adaptive] / sim[best_sim] - 1.0,
        sim_vs_default=sim[adaptive] / sim[default] - 1.0,
    )  # fmt: skip


def _pm(x: pd.Series | np.ndarray, scale: float = 100.0, fmt: str = "{:+.1f}") -> str:
    x = np.asarray(x, float) * scale
    if x.size < 2:
        return fmt.format(x.mean())
    return f"{fmt.format(x.mean())} ± {x.std(ddof=1):.1f}"


def plot(study: dict, s: dict, figdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figdir.mkdir(parents=True, exist_ok=True)
    df, labels = s["df"], s["labels"]
    fig, ax = plt.subplots(figsize=(5, 5))
    for i, label in enumerate(labels):
        d = df[df.label == label]
        ax.scatter(d.wall_s, d.own_s, label=label, color=f"C{i}", s=25)
        ax.scatter(d.wall_s, d.replay_s, facecolors="none", edgecolors=f"C{i}", s=25)
    lo = min(df.wall_s.min(), df.replay_s.min(), df.own_s.min()) * 0.95
    hi = max(df.wall_s.max(), df.replay_s.max(), df.own_s.max()) * 1.05
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.95, hi * 0.95], [lo * 1.05, hi * 1.05], color="0.9")
    ax.set(xlabel="measured wall time (s)", ylabel="simulator, same kills (s)", xlim=(lo, hi))
    ax.set_ylim(lo, hi)
    ax.legend(fontsize=6, loc="upper left")
    ax.set_title(
        "Simulator replay vs measured run (band: ±5 %)\n"
        "filled: the run's own parameters, hollow: pooled parameters",
        fontsize=8,
    )
    p1 = figdir / "closed-loop-prediction.png"
    fig.tight_layout()
    fig.savefig(p1, dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    x = np.arange(len(labels))
    for r in sorted(df.repeat.unique()):
        d = df[df.repeat == r].set_index("label").loc[labels]
        ax.plot(
            x,
            d.wall_s,
            "o-",
            lw=0.6,
            ms=4,
            color="0.5",
            label="measured (one line per repeat)" if r == 0 else None,
        )
    exp = study["expected"]
    means = [exp[k]["mean_s"] for k in labels]
    sds = [exp[k]["sd_s"] / np.sqrt(df.repeat.nunique()) for k in labels]
    ax.errorbar(
        x + 0.15,
        means,
        yerr=sds,
        fmt="s",
        color="C3",
        label="simulator mean (± sd of a mean of the repeats)",
    )
    ax.set_xticks(x, labels, rotation=25, ha="right", fontsize=7)
    ax.set_ylabel("wall time (s)")
    ax.legend(fontsize=7)
    ax.set_title("Wall time per policy, same kill schedules (common random numbers)", fontsize=9)
    p2 = figdir / "closed-loop-policies.png"
    fig.tight_layout()
    fig.savefig(p2, dpi=120)
    plt.close(fig)
    return [p1, p2]


def write_report(
    study: dict, out: Path, figdir: Path, *, command: str, elapsed_s: float | None
) -> Path:
    """Write the markdown report and its figures; ``elapsed_s`` None: runs were reused."""
    s = summarise(study)
    figs = plot(study, s, figdir)
    cfg, p0, p, df = study["cfg"], study["pilot"], study["pooled"], s["df"]
    clock = "exponential" if cfg.weibull_shape is None else f"Weibull shape {cfg.weibull_shape:g}"
    reps = df.repeat.nunique()
    load = study.get("load", {"cpus": "?", "start": float("nan"), "end": float("nan")})
    L = [
        "# Closed loop: real training runs with injected failures",
        "",
        f"Generated by `{command}` "
        + (
            f"in {elapsed_s / 60:.1f} min"
            if elapsed_s is not None
            else "(re-accounted from runs made earlier in the work directory)"
        )
        + "; do not edit by hand.",
        "",
        "## Method",
        "",
        f"- Job: a {_params(cfg)} GPT-style model (torch `TransformerEncoderLayer` blocks with a "
        "causal mask) trained on a corpus the project generates "
        "(`experiments/crashtest/corpus.py`),"
        f" one CPU thread per process, {study['steps']} useful steps, checkpointed by "
        "`simulator.controller.AdaptiveCheckpointer` (weights, AdamW, LR schedule; sync saves).",
        f"- Failures: the supervisor SIGKILLs the process when its lifetime is up — a {clock} "
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
        f"{p0.restart_s:.2f} s; the policies' intervals were set from it. The machine "
        f"({load['cpus']} CPUs) was shared with other work: 1-minute load average "
        f"{load['start']:.1f} at the start and {load['end']:.1f} at the end.",
        "- Simulator: `simulator.montecarlo.run_replica` with the run's own kill times "
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
        "| policy | measured wall (s) | simulator expected (s) | Daly closed form (s) | kills |"
        " lost steps | saving (s) | recovery (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    exp = study["expected"]
    for k in s["labels"]:
        d = df[df.label == k]
        daly = exp[k]["daly_s"]
        L.append(
            f"| {k} | {_pm(d.wall_s, 1.0, '{:.1f}')} | "
            f"{exp[k]['mean_s']:.1f} (sd {exp[k]['sd_s']:.1f}) | "
            f"{'—' if np.isnan(daly) else f'{daly:.1f}'} | {d.failures.mean():.1f} | "
            f"{d.lost_steps.mean():.0f} | {d.saving_s.mean():.1f} | {d.recovery_s.mean():.1f} |"
        )
    err = df.replay_err * 100
    within = (err.abs() <= 5).mean() * 100
    own = df.own_err * 100
    own_within = (own.abs() <= 5).mean() * 100
    imports = np.concatenate([r["import_s"] for r in study["rows"]])
    restores = np.concatenate([r["restore_s"] for r in study["rows"]])
    L += [
        "",
        f"Means ± standard deviation over the {reps} repeats. *Simulator expected* is the "
        "Monte-Carlo mean (sd: spread of one run).",
        "",
        f"Where a restart's {p.restart_s:.1f} s went (means over all launches): the supervisor's "
        f"delay {cfg.restart_delay_s:g} s; interpreter start and imports (torch, "
        f"`simulator.controller`) {imports.mean():.1f} s; building the model and optimizer (the "
        "first AdamW constructed imports `torch._dynamo`) and restoring the "
        f"checkpoint {restores.mean():.2f} s.",
        "",
        "### Does the simulator predict the measured wall time?",
        "",
        f"- Replay (same kills, pooled parameters): error {_pm(df.replay_err)} % (mean ± sd "
        f"over {len(df)} runs), largest {err.abs().max():.1f} %; {within:.0f} % of runs within "
        "±5 % (goal: within 5 %).",
        f"- Replay (same kills, each run's own step time, save stall, restart and start-up): "
        f"error {_pm(df.own_err)} %, largest {own.abs().max():.1f} %; {own_within:.0f} % of "
        "runs within ±5 %. The gap between the two replays is what the machine's changing load "
        f"did: per-run step times ranged {df.step_s.min() * 1e3:.0f}–"
        f"{df.step_s.max() * 1e3:.0f} ms.",
        "- Expected (clock only), per policy, simulator mean / measured mean − 1: "
        + ", ".join(f"{k}: {v * 100:+.1f} %" for k, v in s["mean_err"].items())
        + f". With {reps} repeats the measured mean itself carries the run-to-run spread of "
        "the table's sd column divided by √repeats.",
        "",
        "### Does the adaptive controller match the best fixed interval?",
        "",
        f"- Best fixed interval in hindsight (lowest mean measured wall): **{s['best']}**.",
        f"- Adaptive vs best fixed, same kills: {_pm(s['vs_best'])} % wall time (mean ± sd over"
        " repeats; goal: within 3 %).",
        f"- Adaptive vs the user's default ({s['default']}): {_pm(s['vs_default'])} %"
        " (negative: adaptive is faster).",
        "- At one machine speed (simulated: each run replayed with the pooled parameters and "
        f"the kills it met): best fixed **{s['best_sim']}**; adaptive vs it "
        f"{_pm(s['sim_vs_best'])} %, vs the default {_pm(s['sim_vs_default'])} %. The replay "
        "runs `Adaptive` on the pooled δ and the clock's MTBF, so it shows what the interval "
        "choice is worth, not the live controller's learning.",
        "",
        "### Verdict",
        "",
        *verdict(s, df),
        "",
        "Per repeat (wall s):",
        "",
        "| repeat | " + " | ".join(s["labels"]) + " |",
        "|---" * (len(s["labels"]) + 1) + "|",
    ]
    for r, row in s["wall"].iterrows():
        L.append(f"| {r} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    L += ["", *[f"![{f.stem}](figures/{f.name})" for f in figs], ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L), encoding="utf-8")
    return out


def verdict(s: dict, df: pd.DataFrame) -> list[str]:
    """The goals, each answered from the numbers above."""
    err = df.replay_err.abs()
    own = df.own_err.abs()
    vs_best, vs_default = s["vs_best"], s["vs_default"]
    n = len(vs_best)
    half = 1.96 * vs_best.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    mean_ok = sum(abs(v) <= 0.05 for v in s["mean_err"].values())
    return [
        f"- Simulator within 5 % of the measured wall time: replay with pooled parameters "
        f"{(err <= 0.05).sum()} of {len(df)} runs, with each run's own parameters "
        f"{(own <= 0.05).sum()} of {len(df)}; the Monte-Carlo expectation "
        f"{mean_ok} of {len(s['mean_err'])} policy means.",
        f"- Adaptive within 3 % of the best fixed interval: mean margin "
        f"{vs_best.mean() * 100:+.1f} % (95 % interval ±{half * 100:.1f} % from {n} repeats) "
        f"— {'met' if vs_best.mean() <= 0.03 else 'not met'} on the mean.",
        f"- Adaptive beats the default ({s['default']}): faster in "
        f"{(vs_default < 0).sum()} of {n} repeats, mean {vs_default.mean() * 100:+.1f} %.",
    ]


def _params(cfg) -> str:
    from experiments.crashtest.corpus import VOCAB
    from experiments.crashtest.model import GPTConfig, TinyGPT

    args = {"n_layer": 2, "n_embd": 128, "block_size": 32}
    args.update(
        {
            k if k != "block" else "block_size": v
            for k, v in cfg.model_args.items()
            if k in ("n_layer", "n_embd", "block")
        }
    )
    model = TinyGPT(GPTConfig(vocab_size=len(VOCAB), **args))
    n = sum(p.numel() for p in model.parameters())
    return f"{n / 1e6:.2f} M-parameter"
