"""Do the OPT-175B and BLOOM-176B presets reproduce what their sources published?

For each preset, the numbers its sources publish, each with its source, stand beside the
preset's value and a check: "matches" (within 5 %), "in range" (inside a published range) or
"assumption" (no source gives it). Then the outcome the preset gives at its optimum (closed
form, as in ``llama3_calibration``: Daly's expected wall time, exact for exponential failures,
at its exact minimiser) is set against the published outcome: how long the run took, how many
interruptions it had, how often it saved and how much a crash cost. Published numbers are
quoted from the cited sources; every other number is computed here.

    python -m experiments.presets_check
"""

from __future__ import annotations

from datetime import date

import pandas as pd
from scipy import optimize

from experiments._calibrate import largest_within, lost_since_save_s, optimum
from experiments._report import Report, table
from simulator import analytic
from simulator.display import format_usd
from simulator.model.scenario import load_scenario

HOUR = 3600.0
WEEK_H = 7 * 24.0
MATCH = 0.05  # "matches": within 5 % of the published number
TIB = 2.0**40

# -- OPT-175B -------------------------------------------------------------------------------
OPT_CHRONICLES = "https://github.com/facebookresearch/metaseq/blob/main/projects/OPT/chronicles"
OPT_SOURCES = (
    'S. Zhang et al., "OPT: Open Pre-trained Transformer Language Models", arXiv:2205.01068 '
    "(2022), https://arxiv.org/abs/2205.01068",
    f'"175B Training Run Completed" (Jan 7, 2022), {OPT_CHRONICLES}/final_update.md',
    f'"Update on 175B Training Run: 27% through" (Dec 3, 2021), '
    f"{OPT_CHRONICLES}/27_percent_update.md",
    f'"Update on 175B Training Run: 10% through" (Nov 17, 2021), '
    f"{OPT_CHRONICLES}/10_percent_update.md",
)
OPT_GPUS = 992  # [1] §2.4: "We trained OPT-175B on 992 80GB A100 GPUs"
OPT_TFLOPS = 147.0  # [1] §2.4: "utilization of up to 147 TFLOP/s per GPU"
OPT_BYTES_PER_PARAM = 2 + 4 + 4  # [1] §2.4: FP16 weights; Adam state (two moments) in FP32
OPT_PARAMS = 175e9
OPT_MANUAL_RESTARTS = 35  # [1] §2.5: "at least 35 manual restarts"
OPT_AUTO_RESTARTS = 70  # [1] §2.5: "we estimate 70+ automatic restarts"
OPT_HOSTS_CYCLED = 100  # [1] §2.5: "the cycling of over 100 hosts over the course of 2 months"
OPT_MACHINES_DOWN_PER_DAY = 2  # [2]: "~2 machines go down every day"
OPT_FLOPS = 4.30e23  # [2]: "~4.30E+23 FLOPs of compute"
OPT_DAYS_ON_1024 = 33  # [2]: "~33 days of continuous training on 1024 80GB A100s"
OPT_RESTARTS_12XX = 90  # [2]: "~90 restarts over the course of training ... (experiments 12.xx)"
OPT_START = date(2021, 11, 11)  # [4]: "launched experiment 12.00 on November 11"
OPT_END = date(2022, 1, 6)  # [2]: "completed its training run" on January 6
OPT_CKPT_TB = 1.6  # [3]: "1.6TB of a single model checkpoint (992 files, each ~1.7GB)"
OPT_CKPT_FILES = 992
OPT_FILE_GB = 1.7
OPT_DELTAS_S = (60.0, 300.0, 900.0)

# -- BLOOM-176B -----------------------------------------------------------------------------
BLOOM_TRAIN = "https://github.com/bigscience-workshop/bigscience/blob/master/train/tr11-176B-ml"
BLOOM_SOURCES = (
    'BigScience Workshop, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", '
    "arXiv:2211.05100 (2022), https://arxiv.org/abs/2211.05100",
    '"The Technology Behind BLOOM Training", Hugging Face blog, '
    "https://huggingface.co/blog/bloom-megatron-deepspeed#training-difficulties",
    f"tr11-176B-ml training chronicles, {BLOOM_TRAIN}/chronicles.md",
    f"tr11-176B-ml training README, {BLOOM_TRAIN}/README.md",
)
BLOOM_GPUS = 384  # [1] §3.4.1: "48 nodes, each having 8 NVIDIA A100 80GB GPUs (a total of 384"
BLOOM_COMPUTE_HOURS = 1_082_990  # [1] §3.4.1: "consumed 1,082,990 compute hours"
BLOOM_MONTHS = 3.5  # [1] §3.4.1: "about 3.5 months"
BLOOM_FAILURES_PER_WEEK = (1.0, 2.0)  # [2]: "on average we were getting 1-2 GPU failures a week"
BLOOM_INTERVAL_H = 3.0  # [2]: "We were saving a checkpoint every 3h (100 iterations)"
BLOOM_LOST_PER_CRASH_H = 1.5  # [2]: "on average we would lose 1.5h of training on hardware crash"
BLOOM_SAVE_S = 40.0  # [3] 2022-03-18: "A checkpoint is saved in 40 secs"; [4] Times: "~40sec"
BLOOM_PARAMS = 176e9  # [4] Checkpoints: "176*10**9*14/2**30=2294.77GB", "du -sh" 2.3T
BLOOM_BYTES_PER_PARAM = 14
BLOOM_CKPT_GIB = 2294.77


def fact(what: str, published: str, source: str, preset: str, check: str) -> dict:
    return {"": what, "published": published, "source": source, "preset": preset, "check": check}


def agree(preset: float, published: float) -> str:
    diff = preset / published - 1.0
    return f"{'matches' if abs(diff) <= MATCH else 'differs'} ({diff:+.1%})"


def in_range(preset: float, low: float, high: float) -> str:
    return "in range" if low <= preset <= high else "out of range"


def opt_published() -> dict:
    """OPT-175B's derived published numbers: failure-free compute, run length, losses."""
    work_h = OPT_FLOPS / (OPT_GPUS * OPT_TFLOPS * 1e12) / HOUR
    wall_h = (OPT_END - OPT_START).days * 24.0
    return {
        "mtbf_h": 24.0 / OPT_MACHINES_DOWN_PER_DAY,
        "work_h": work_h,
        "wall_h": wall_h,
        "loss": 1.0 - work_h / wall_h,
        "checkpoint_bytes": OPT_PARAMS * OPT_BYTES_PER_PARAM,
        "hw_restarts": OPT_MANUAL_RESTARTS + OPT_AUTO_RESTARTS,
    }


def opt_facts(s) -> list[dict]:
    p = opt_published()
    mtbf_h = s.system_mtbf_s / HOUR
    ckpt = s.checkpoint_bytes
    return [
        fact("GPUs", f"{OPT_GPUS:,}", "[1] §2.4", f"{s.gpus:,}", agree(s.gpus, OPT_GPUS)),
        fact(
            "system MTBF",
            f"~{OPT_MACHINES_DOWN_PER_DAY} machines down a day: {p['mtbf_h']:g} h",
            "[2] Cluster Deletion",
            f"{mtbf_h:.2f} h",
            agree(mtbf_h, p["mtbf_h"]),
        ),
        fact("save stall δ", "not found", "", f"{s.checkpoint_s:g} s", "assumption"),
        fact(
            "restart cost R",
            'not found (replacing a node "can take hours" before spare hosts were pooled)',
            "[3]",
            f"{s.restart_s / 60:g} min",
            "assumption",
        ),
        fact(
            "failure-free compute",
            f"{OPT_FLOPS:.2e} FLOPs (~{OPT_DAYS_ON_1024} days on 1,024 GPUs) at up to "
            f"{OPT_TFLOPS:g} TFLOP/s per GPU on {OPT_GPUS}: {p['work_h']:.1f} h (at least: "
            "147 is the best utilization)",
            "[2]; [1] §2.4",
            f"{s.work_h:g} h",
            agree(s.work_h, p["work_h"]),
        ),
        fact(
            "checkpoint size",
            f"{OPT_CKPT_TB:g}TB in {OPT_CKPT_FILES} files of ~{OPT_FILE_GB:g}GB; FP16 weights "
            f"and FP32 Adam state: {OPT_BYTES_PER_PARAM} B/param, {p['checkpoint_bytes']:.3g} B",
            "[3]; [1] §2.4",
            f"{ckpt:.3g} B = {ckpt / TIB:.2f} TiB, {ckpt / OPT_CKPT_FILES / 1e9:.2f} GB a file",
            f"{agree(ckpt / TIB, OPT_CKPT_TB)} in TiB ({ckpt / (OPT_CKPT_TB * 1e12) - 1:+.1%} "
            f"in decimal TB), {agree(ckpt / OPT_CKPT_FILES / 1e9, OPT_FILE_GB)} a file",
        ),
        fact("price", "not found", "", f"${s.usd_per_gpu_hour:.2f}/GPU-h", "assumption"),
    ]


def bloom_published() -> dict:
    low, high = BLOOM_FAILURES_PER_WEEK
    wall_h = BLOOM_COMPUTE_HOURS / BLOOM_GPUS
    return {
        "mtbf_h": (WEEK_H / high, WEEK_H / low),
        "wall_h": wall_h,
        "failures": (low * wall_h / WEEK_H, high * wall_h / WEEK_H),
        "checkpoint_bytes": BLOOM_PARAMS * BLOOM_BYTES_PER_PARAM,
    }


def bloom_facts(s) -> list[dict]:
    p = bloom_published()
    mtbf_h = s.system_mtbf_s / HOUR
    low, high = p["mtbf_h"]
    ckpt = s.checkpoint_bytes
    return [
        fact("GPUs", f"{BLOOM_GPUS:,}", "[1] §3.4.1", f"{s.gpus:,}", agree(s.gpus, BLOOM_GPUS)),
        fact(
            "system MTBF",
            f"1-2 GPU failures a week: {low:g} to {high:g} h",
            "[2]",
            f"{mtbf_h:.2f} h",
            in_range(mtbf_h, low, high),
        ),
        fact(
            "save stall δ",
            f"{BLOOM_SAVE_S:g} s",
            "[3] 2022-03-18; [4] Times",
            f"{s.checkpoint_s:g} s",
            agree(s.checkpoint_s, BLOOM_SAVE_S),
        ),
        fact(
            "restart cost R",
            'not found ("Most of the time the SLURM job auto-restarts")',
            "[3] 2022-04-XX",
            f"{s.restart_s / 60:g} min",
            "assumption",
        ),
        fact(
            "failure-free compute",
            f"not found; the run took about {BLOOM_MONTHS:g} months, {BLOOM_COMPUTE_HOURS:,} "
            f"compute hours on {BLOOM_GPUS} GPUs: {p['wall_h']:.0f} h of wall time",
            "[1] §3.4.1",
            f"{s.work_h:g} h",
            "assumption",
        ),
        fact(
            "checkpoint size",
            f'{BLOOM_CKPT_GIB:g} GB (GiB, "2.3TB"): {BLOOM_BYTES_PER_PARAM} B/param, '
            f"{p['checkpoint_bytes']:.3g} B",
            "[4] Checkpoints",
            f"{ckpt:.3g} B = {ckpt / 2**30:.0f} GiB",
            agree(ckpt / 2**30, BLOOM_CKPT_GIB),
        ),
        fact("price", "not found", "", f"${s.usd_per_gpu_hour:.2f}/GPU-h", "assumption"),
    ]


def sources(items: tuple[str, ...]) -> str:
    return "\n".join(f"- [{i}] {text}" for i, text in enumerate(items, 1))


def outcome(o: dict) -> str:
    return (
        f"saves every {o['optimal_interval_s'] / 60:.0f} min of compute, wastes "
        f"{o['optimal_waste_fraction']:.1%} of the wall time on saves, lost work and restarts, "
        f"takes {o['expected_wall_h']:,.0f} h ({o['expected_wall_h'] / 24:.1f} days) for "
        f"{o['work_h']:,.1f} h of work and loses {format_usd(o['usd_lost_per_day'])} a day"
    )


def _and(items: list[str]) -> str:
    if not items:
        return "nothing"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def summary(facts: list[dict]) -> str:
    """Which rows agree with the sources, which do not, and which are assumptions."""
    agree_ = [f[""] for f in facts if f["check"].startswith(("matches", "in range"))]
    differ = [f[""] for f in facts if f["check"].startswith(("differs", "out of range"))]
    assumed = [f[""] for f in facts if f["check"] == "assumption"]
    parts = [f"{_and(agree_)} agree with the sources"]
    if differ:
        parts.append(f"{_and(differ)} do not")
    parts.append(f"{_and(assumed)} are assumptions (not found)")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def opt_section(rep: Report) -> None:
    s = load_scenario("opt175b")
    p = opt_published()
    o = optimum(s)
    mtbf_h = s.system_mtbf_s / HOUR
    facts = opt_facts(s)
    rep.add("## OPT-175B (`simulator/presets/opt175b.toml`)")
    rep.add(sources(OPT_SOURCES))
    rep.add(table(pd.DataFrame(facts)))
    lost_pub = p["wall_h"] - p["work_h"]
    lost_model = o["expected_wall_h"] - o["work_h"]
    failures_model = o["expected_wall_h"] / mtbf_h
    failures_wall = p["wall_h"] / mtbf_h
    rep.add(
        f"**Outcome.** At its optimum the preset {outcome(o)} (at the assumed price). "
        f"Published: the run that finished went from {OPT_START:%Y-%m-%d} (experiment 12.00, "
        f"[4]) to {OPT_END:%Y-%m-%d} ([2]), {p['wall_h']:,.0f} h, so at most "
        f"{p['loss']:.0%} of its wall time ({lost_pub:,.0f} h) went to losses of every kind. "
        f"The preset's failures, saves and restarts take {lost_model:,.0f} h "
        f"({lost_model / lost_pub:.0%} of that). The sources report losses the model leaves out or "
        "may understate: restarts from earlier checkpoints after loss divergences ([1] §2.5), "
        'and hardware issues that "can take the experiment down for hours" ([3]), against the '
        f"preset's {s.restart_s / 60:g} min restart."
    )
    rep.add(
        f"**Interruptions.** The preset's MTBF of {mtbf_h:g} h gives {failures_model:.0f} "
        f"failures over its own expected wall time and {failures_wall:.0f} over the published "
        f"{p['wall_h'] / 24:.0f} days. Published: at least {OPT_MANUAL_RESTARTS} manual and an "
        f"estimated {OPT_AUTO_RESTARTS}+ automatic restarts from hardware failures, at least "
        f"{p['hw_restarts']} in all, and over {OPT_HOSTS_CYCLED} hosts cycled, over 2 months "
        f"([1] §2.5); the logbook covers ~{OPT_RESTARTS_12XX} restarts, of all causes, of the "
        "lineage of the final model (experiments 12.xx, [2])."
    )
    rows = []
    for d in sorted({*OPT_DELTAS_S, s.checkpoint_s}):
        r = largest_within(s, "restart_s", p["loss"], checkpoint_s=d)
        rows.append(
            {
                "δ": f"{d:g} s" + (" (preset)" if d == s.checkpoint_s else ""),
                f"largest R with waste ≤ {p['loss']:.0%}": "none"
                if r is None
                else f"{r / HOUR:.1f} h",
            }
        )
    rep.add(
        "δ and R are not published. If every hour the published run lost had gone to saves, "
        "lost work and restarts, the mean restart could have taken at most (closed form, the "
        "preset's MTBF):"
    )
    rep.add(table(pd.DataFrame(rows)))
    bound = largest_within(s, "restart_s", p["loss"], checkpoint_s=s.checkpoint_s)
    fits_count = failures_wall >= p["hw_restarts"]
    fits_loss = lost_model <= lost_pub
    rep.add(
        f"**Verdict.** {summary(facts)} At the preset's failure rate the published "
        f"{p['wall_h'] / 24:.0f} days hold {failures_wall:.0f} failures; the paper counts at "
        f"least {p['hw_restarts']} hardware restarts in about 2 months"
        + (": consistent" if fits_count else ", more than the preset gives")
        + f". The preset's modelled losses ({lost_model:,.0f} h) are "
        + ("within" if fits_loss else "more than")
        + f" the at most {lost_pub:,.0f} h the published run lost. "
        + (
            "On these counts the preset is consistent with the published outcome. "
            if fits_count and fits_loss
            else "On these counts the preset does not fit the published outcome. "
        )
        + "That outcome does not pin δ or R: "
        + (
            f"it allows any mean R up to {bound / HOUR:.1f} h at the preset's δ of "
            f"{s.checkpoint_s:g} s, "
            if bound is not None
            else ""
        )
        + f"so the preset's {s.restart_s / 60:g} min restart, and with it the waste at the "
        "optimum, rests on assumptions."
    )


def bloom_section(rep: Report) -> None:
    s = load_scenario("bloom176b")
    p = bloom_published()
    o = optimum(s)
    mtbf_s = s.system_mtbf_s
    delta, restart = s.checkpoint_s, s.restart_s
    facts = bloom_facts(s)
    failures_model = o["expected_wall_h"] * HOUR / mtbf_s
    low, high = p["failures"]
    tau_pub = BLOOM_INTERVAL_H * HOUR
    tau_star = o["optimal_interval_s"]
    waste_pub = float(analytic.waste_fraction(tau_pub, delta, mtbf_s, restart))
    excess = 100 * (waste_pub - o["optimal_waste_fraction"])
    lost_h = lost_since_save_s(tau_pub + delta, mtbf_s) / HOUR
    wall_diff = o["expected_wall_h"] / p["wall_h"] - 1.0
    rep.add("## BLOOM-176B (`simulator/presets/bloom176b.toml`)")
    rep.add(sources(BLOOM_SOURCES))
    rep.add(table(pd.DataFrame(facts)))
    rep.add(
        f"**Outcome.** At its optimum the preset {outcome(o)} (at the assumed price). "
        f"Published: {p['wall_h']:,.0f} h of wall time ({BLOOM_COMPUTE_HOURS:,} compute hours "
        f"on {BLOOM_GPUS} GPUs, [1] §3.4.1). The preset's work of {s.work_h:,.0f} h is the "
        "published duration taken as failure-free compute, so its expected wall time comes out "
        f"{wall_diff:+.1%} off the published one."
    )
    rep.add(
        f"**Interruptions.** The preset gives {failures_model:.0f} failures over its expected "
        f"wall time; 1-2 a week ([2]) over the published {p['wall_h']:,.0f} h are "
        f"{low:.0f} to {high:.0f}: {in_range(failures_model, low, high)}. The run also had "
        '"5-10h downtime several times" from a PyTorch deadlock and from running out of disk '
        "space ([2]), which the model does not have."
    )
    rep.add(
        f"**Checkpoint interval.** Published: every {BLOOM_INTERVAL_H:g} h (100 iterations), "
        f"losing {BLOOM_LOST_PER_CRASH_H:g} h of training per crash on average ([2]). The "
        f"model's expected loss per failure at that interval is {lost_h:.2f} h: "
        f"{agree(lost_h, BLOOM_LOST_PER_CRASH_H)}. With the published {delta:g} s save and "
        f"the preset's failure rate the optimum is every {tau_star / HOUR:.2f} h; the published "
        f"{BLOOM_INTERVAL_H:g} h wastes {waste_pub:.2%} against {o['optimal_waste_fraction']:.2%} "
        f"({excess:+.2f} points). {BLOOM_INTERVAL_H:g} h would be the optimum for a save of "
        f"{_delta_for_interval(tau_pub, mtbf_s):.0f} s."
    )
    rep.add(
        f"**Verdict.** {summary(facts)} The preset's failures over the run are "
        f"{in_range(failures_model, low, high)} of the published count, its expected wall time "
        f"is {wall_diff:+.1%} off the published one, and the lost work per crash at the "
        f"published interval {agree(lost_h, BLOOM_LOST_PER_CRASH_H).split()[0]} the published "
        f"figure. By the model, the published {BLOOM_INTERVAL_H:g} h interval is "
        f"{tau_pub / tau_star:.1f}x the optimum and costs {excess:.2f} points of waste."
    )


def _delta_for_interval(tau_s: float, mtbf_s: float) -> float:
    """The save stall δ whose exact optimum is ``tau_s`` (the optimum grows with δ)."""
    return optimize.brentq(
        lambda d: analytic.optimal_interval(d, mtbf_s) - tau_s, 1e-6, tau_s, xtol=1e-6
    )


def main() -> None:
    rep = Report(
        "presets_check", "OPT-175B and BLOOM-176B presets against their sources", quoted=True
    )
    rep.add(
        'Each table sets a number the sources publish beside the preset\'s value: "matches" '
        f'is within {MATCH:.0%}, "in range" inside a published range, "assumption" a '
        'number no source gives ("not found"). Outcomes are closed form (Daly\'s expected '
        "wall time at its exact minimiser, exponential failures). Published numbers are "
        "quoted from the sources cited under each preset; every other number is computed "
        "by the script."
    )
    opt_section(rep)
    bloom_section(rep)
    rep.write()


if __name__ == "__main__":
    main()
