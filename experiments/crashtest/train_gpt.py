"""The training job of the crash test: a small GPT on the generated corpus, on one CPU thread.

Run as ``python -m experiments.crashtest.train_gpt --run-dir D --steps N --policy SPEC``.
It restores the newest checkpoint under ``D/ckpt`` (via ``AdaptiveCheckpointer``), trains to
step N, saves at the end and writes the final weights and optimizer moments to
``D/final.safetensors``. Training is a pure function of the restored state and the step number
(batches are drawn from a generator seeded by the step, no dropout), so a run killed and
resumed any number of times ends bit-identical to one that never stopped.

Every event the supervisor needs for its time accounting is appended to ``D/events.jsonl``
with ``time.monotonic()`` stamps (one clock for all processes on Linux): ``start`` (imports
done), ``ready`` (checkpoint restored), ``step``, ``save_start`` / ``save_end`` and ``done``.
Lines are written unbuffered, so a SIGKILL loses at most the event in progress.

Policy SPEC (JSON): ``{"kind": "fixed", "interval_s": 4.0}``, ``{"kind": "steps",
"every": 500}`` (save every N steps, as most trainers' defaults do), ``{"kind": "optimal"}``
(``policies.ExactOptimal`` fed by the controller's live estimates) or ``{"kind": "adaptive"}``
(``policy=None``, the controller's default). With a local tier (``--local-dir``):
``{"kind": "tiers", "local_s": 1.5, "persistent_s": 17.0}`` (a ``TierSchedule``),
``{"kind": "steps-tiers", "local_every": 100, "persistent_every": 1000}`` or
``{"kind": "adaptive-tiers"}`` (``policy=None``: the model's tier plan, learned live, from the
prior ``--prior-json``). ``--grace-s`` is the checkpointer's ``preemption_grace_s``;
``--persistent-bytes-per-s`` slows the persistent tier (``slowstore``). With a grace period
the checkpointer stops on a preemption (``on_preemption="stop"``) so that the job logs
``preempted`` the moment the save is committed, then closes and exits with status 75.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

EVENTS = "events.jsonl"
FINAL = "final.safetensors"


class EventLog:
    """Unbuffered JSONL appends: each event is one write(2) on an O_APPEND descriptor."""

    def __init__(self, path: Path, attempt: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.attempt = attempt

    def __call__(self, event: str, **fields) -> None:
        record = {"event": event, "attempt": self.attempt, "t": time.monotonic(), **fields}
        os.write(self.fd, (json.dumps(record) + "\n").encode())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True, help="useful steps the job needs")
    p.add_argument("--policy", default='{"kind": "adaptive"}', help="policy spec (JSON)")
    p.add_argument("--attempt", type=int, default=0, help="launch number (for the log)")
    p.add_argument("--mtbf-s", type=float, default=60.0, help="prior MTBF for the controller")
    p.add_argument("--restart-s", type=float, default=5.0, help="prior restart cost, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=192)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--local-dir", type=Path, help="the local checkpoint tier")
    p.add_argument("--grace-s", type=float, help="preemption grace period, seconds")
    p.add_argument("--persistent-bytes-per-s", type=float, help="slow the persistent tier")
    p.add_argument("--prior-json", help="tiered prior: process/node MTBF, local/persistent s")
    return p.parse_args(argv)


def draw_batch(data, *, seed: int, step: int, batch: int, block: int):
    """(inputs, targets) of ``step``: ``batch`` windows of ``block + 1`` characters of ``data``
    at offsets drawn from a generator seeded by ``(seed, step)``, so a resumed run sees the
    same batches as one that never stopped (the precision study trains with it too)."""
    import numpy as np
    import torch

    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, len(data) - block - 1, size=batch)
    rows = torch.from_numpy(np.stack([data[s : s + block + 1] for s in starts]).astype(np.int64))
    return rows[:, :-1], rows[:, 1:]


def make_policy(spec: dict):
    """(policy for the controller, save-every-N-steps or None) from a policy spec."""
    from simulator import policies

    kind = spec["kind"]
    if kind == "fixed":
        return policies.FixedInterval(float(spec["interval_s"])), None
    if kind == "steps":
        # The controller's own schedule is pushed out of reach; the loop saves every N steps.
        return policies.FixedInterval(1e12), int(spec["every"])
    if kind == "optimal":
        return policies.ExactOptimal(), None
    if kind in ("adaptive", "adaptive-tiers"):
        return None, None
    from simulator.model.tiers import TierSchedule

    if kind == "tiers":
        return TierSchedule({"local": spec["local_s"], "persistent": spec["persistent_s"]}), None
    if kind == "steps-tiers":
        every = {"local": int(spec["local_every"]), "persistent": int(spec["persistent_every"])}
        return TierSchedule({"local": 1e12, "persistent": 1e12}), every
    raise SystemExit(f"unknown policy kind {kind!r}")


def tier_prior(args):
    """The tiered controller's prior: a scenario with the failure classes and tiers."""
    if not args.prior_json:
        return None
    from simulator.controller.tier_schedule import tier_scenario

    prior = json.loads(args.prior_json)
    return tier_scenario(
        local_s=prior["local_s"],
        persistent_s=prior["persistent_s"],
        rates_per_s={"process": 1 / prior["process_mtbf_s"], "node": 1 / prior["node_mtbf_s"]},
        restart_s=args.restart_s,
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    log = EventLog(args.run_dir / EVENTS, args.attempt)

    import torch
    from safetensors.torch import save_file

    from experiments.crashtest.corpus import VOCAB, encode, generate_corpus
    from experiments.crashtest.model import GPTConfig, TinyGPT
    from simulator.controller import AdaptiveCheckpointer

    torch.set_num_threads(1)
    log("start", pid=os.getpid())
    data = encode(generate_corpus(seed=args.seed))
    config = GPTConfig(
        vocab_size=len(VOCAB), block_size=args.block, n_layer=args.n_layer, n_embd=args.n_embd
    )
    torch.manual_seed(args.seed)
    model = TinyGPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    spec = json.loads(args.policy)
    policy, every_steps = make_policy(spec)
    tiered = {}
    if args.local_dir is not None:
        tiered = dict(local_dir=args.local_dir, preemption_grace_s=args.grace_s)
    elif args.grace_s is not None:
        tiered = dict(preemption_grace_s=args.grace_s)
    if args.grace_s is not None:
        tiered["on_preemption"] = "stop"
    scenario = tier_prior(args)
    directory = args.run_dir / "ckpt"
    storage = None
    if args.persistent_bytes_per_s:
        from experiments.crashtest.slowstore import ThrottledStorage

        storage = ThrottledStorage(directory, args.persistent_bytes_per_s)
    ckpt = AdaptiveCheckpointer(
        directory,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        policy=policy,
        mtbf_h=None if scenario is not None else args.mtbf_s / 3600.0,
        scenario=scenario,
        restart_s=args.restart_s,
        keep_last=2,
        total_steps=args.steps,
        config={"steps": args.steps, "seed": args.seed, "model": vars(config)},
        storage=storage,
        **tiered,
    )
    step = ckpt.restore()
    log("ready", step=step, tier=ckpt.stats.get("restored_tier"))
    step, loss = _train(args, ckpt, model, optimizer, scheduler, data, step, every_steps, log)
    final = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, state in optimizer.state_dict()["state"].items():
        for name, value in state.items():
            if torch.is_tensor(value):
                final[f"optim.{i}.{name}"] = value.clone()
    save_file(final, str(args.run_dir / FINAL))
    log(
        "done",
        step=step,
        loss=None if loss is None else float(loss.detach()),
        stats=_jsonable(ckpt.stats),
    )
    return 0


def _preempted_tier(ckpt) -> str | None:
    events = ckpt.runlog.events()
    return next((e.get("tier") for e in reversed(events) if e["event"] == "preempted"), None)


def _saved(ckpt) -> dict:
    """The tiers the last save went to, with their stalls (seconds), and their intervals."""
    stats = ckpt.stats
    stalls = stats.get("last_save_stall_s") or {"persistent": stats["save_stall_s"]}
    steps = stats.get("tier_interval_steps") or {"persistent": stats["interval_steps"]}
    return {"tiers": stalls, "interval_steps": steps}


def _stop_if_preempted(ckpt, step: int, log) -> None:
    """After a preemption's save (committed by now): log it, close, exit with status 75."""
    if ckpt.preempted:
        log("preempted", step=step, tier=_preempted_tier(ckpt))
        ckpt.close(finished=False)
        raise SystemExit(75)  # PREEMPTED_EXIT_CODE


def _train(args, ckpt, model, optimizer, scheduler, data, step, every_steps, log):
    def batch(i: int):

        return draw_batch(data, seed=args.seed, step=i, batch=args.batch, block=args.block)

    saved_at = step
    loss = None
    while step < args.steps:
        x, y = batch(step)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        log("step", step=step)
        if isinstance(every_steps, dict):  # a hand-set tier schedule in steps
            due = [t for t in ("local", "persistent") if step % every_steps[t] == 0]
            if due:
                log("save_start", step=step)
                for tier in due:
                    ckpt.save(step, tier=tier)
                log("save_end", step=step, **_saved(ckpt))
                saved_at = step
            else:
                ckpt.step(step)
                _stop_if_preempted(ckpt, step, log)
        elif every_steps is not None:
            if step % every_steps == 0:
                log("save_start", step=step)
                ckpt.save(step)
                log("save_end", step=step)
                saved_at = step
            else:
                ckpt.step(step)
                _stop_if_preempted(ckpt, step, log)
        else:
            due = step >= ckpt.next_due_step
            if due:
                log("save_start", step=step)
            if ckpt.step(step):
                _stop_if_preempted(ckpt, step, log)
                log("save_end", step=step, **_saved(ckpt))
                saved_at = step
            elif due:
                log("save_skipped", step=step)
    final_missing = ckpt.local is not None and ckpt.last_saved_step != step
    if saved_at != step or final_missing:  # the job ends saved, persistently, as simulated
        log("save_start", step=step)
        ckpt.save(step)
        log("save_end", step=step, tiers={"persistent": ckpt.stats["save_stall_s"]})
    ckpt.close()
    return step, loss


def _jsonable(stats) -> dict:
    out = {}
    for k, v in dict(stats or {}).items():
        if isinstance(v, bool | int | float | str) or v is None:
            out[k] = v
    return out


if __name__ == "__main__":
    sys.exit(main())
