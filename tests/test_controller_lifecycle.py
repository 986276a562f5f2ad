"""The run's life cycle: a final save at close, a finished run that stays finished, config keys
that may change between launches, a log line per save, and preemption signals.

The relaunch and preemption tests run a real training script in a subprocess, relaunch it the
way a scheduler would, and compare a digest of its final state (parameters, AdamW moments,
torch RNG) with an uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, IncompatibleCheckpoint
from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE
from simulator.controller.runlog import RUNLOG, failure_evidence, read_events
from simulator.controller.storage import checkpoint_name
from simulator.errors import InputError
from simulator.policies import FixedInterval

ROOT = Path(__file__).resolve().parents[1]

_TRAIN = r"""
import hashlib, os, sys, time
import torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval

directory, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
delay = float(os.environ.get("STEP_DELAY_S", "0"))
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(16, 1)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ckpt = AdaptiveCheckpointer(
    directory, model=model, optimizer=opt,
    policy=FixedInterval(float(os.environ.get("INTERVAL_S", "1e9"))), probe_steps=5,
    total_steps=steps, config={"steps": steps, "lr": 1e-2}, ignore_config_keys=("steps",),
    async_save="async" in mode,
)
step = ckpt.restore()
print("START", step, ckpt.finished, flush=True)
while step < steps:
    g = torch.Generator().manual_seed(step)  # the data position is the step
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    step += 1
    ckpt.step(step)
    print("STEP", step, flush=True)
    time.sleep(delay)
if "exit" in mode:  # sys.exit before close(): a NaN guard's, or a script's normal end
    sys.exit(int(os.environ["EXIT_STATUS"]))
if "noclose" not in mode:
    ckpt.close()
h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
for s in opt.state_dict()["state"].values():
    h.update(s["exp_avg"].numpy().tobytes() + s["exp_avg_sq"].numpy().tobytes())
print("DIGEST", h.hexdigest(), flush=True)
"""


def _script(tmp_path: Path) -> Path:
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(_TRAIN)
    return script


def _env(**extra: str) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", **extra}


def launch(tmp_path, directory, steps, mode="close", **env) -> subprocess.CompletedProcess:
    run = subprocess.run(
        [sys.executable, str(_script(tmp_path)), str(directory), str(steps), mode],
        capture_output=True, text=True, timeout=300, env=_env(**env),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def lines(out: str, tag: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith(tag + " ")]


def events(directory: Path) -> list[dict]:
    return read_events(directory / RUNLOG)


def step_dirs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))


# -- the end of a run ---------------------------------------------------------------------------
def test_close_saves_the_tail_and_a_relaunched_finished_run_returns_at_once(tmp_path):
    first = launch(tmp_path, tmp_path / "ck", 30)
    # The policy never saved (a 1e9 s interval): only close() did, at the last step.
    assert step_dirs(tmp_path / "ck") == [checkpoint_name(30)]
    again = launch(tmp_path, tmp_path / "ck", 30)
    assert lines(again.stdout, "START") == ["30 True"] and not lines(again.stdout, "STEP")
    assert "run already finished at step 30" in again.stderr
    assert lines(again.stdout, "DIGEST") == lines(first.stdout, "DIGEST")
    finished = [e["step"] for e in events(tmp_path / "ck") if e["event"] == "finished"]
    assert finished == [30, 30]
    assert failure_evidence(events(tmp_path / "ck"), exclude_session="next").failures == 0
    # Finished means "nothing newer at 30 steps": with more steps (the "steps" config key is
    # declared ignorable) the run goes on.
    more = launch(tmp_path, tmp_path / "ck", 40)
    assert lines(more.stdout, "START") == ["30 False"]
    assert lines(more.stdout, "STEP") == [str(s) for s in range(31, 41)]
    assert step_dirs(tmp_path / "ck") == [checkpoint_name(30), checkpoint_name(40)]


@pytest.mark.slow
def test_a_finished_run_continued_to_more_steps_ends_as_one_that_never_stopped(tmp_path):
    launch(tmp_path, tmp_path / "ck", 30)
    more = launch(tmp_path, tmp_path / "ck", 40)
    straight = launch(tmp_path, tmp_path / "straight", 40)
    assert lines(more.stdout, "DIGEST") == lines(straight.stdout, "DIGEST")


def test_a_script_ending_normally_without_close_saves_its_last_step_as_finished(tmp_path):
    # Asynchronous saves: at interpreter exit the write threads are gone, so the final save
    # must be made synchronously.
    launch(tmp_path, tmp_path / "ck", 12, "noclose-async")
    assert step_dirs(tmp_path / "ck") == [checkpoint_name(12)]
    assert [e["event"] for e in events(tmp_path / "ck")][-2:] == ["finished", "stop"]


@pytest.mark.parametrize("status", [3, 0])
def test_a_script_that_calls_sys_exit_before_close_is_finished_only_on_success(tmp_path, status):
    # From the new-user review: sys.exit(1) (a NaN guard) was closed as a finished run at
    # exit, its possibly diverged last step saved as the newest checkpoint.
    run = subprocess.run(
        [sys.executable, str(_script(tmp_path)), str(tmp_path / "ck"), "12", "exit"],
        capture_output=True, text=True, timeout=300, env=_env(EXIT_STATUS=str(status)),
    )  # fmt: skip
    assert run.returncode == status, run.stderr[-3000:]
    log = [e["event"] for e in events(tmp_path / "ck")]
    if status:
        assert step_dirs(tmp_path / "ck") == [] and "finished" not in log
        assert log[-1] == "stop"  # a clean stop, as a with block left by SystemExit records
        assert "exited with status 3 before close()" in run.stderr
    else:
        assert step_dirs(tmp_path / "ck") == [checkpoint_name(12)]
        assert log[-2:] == ["finished", "stop"]


def test_an_exception_in_a_with_block_is_a_failure_with_no_final_save(tmp_path):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="diverged"):
        with AdaptiveCheckpointer(tmp_path, model=model, policy=FixedInterval(1e9)) as ck:
            for step in range(1, 8):
                ck.step(step)
            raise RuntimeError("loss diverged")
    assert step_dirs(tmp_path) == []
    assert "finished" not in [e["event"] for e in events(tmp_path)]
    assert failure_evidence(events(tmp_path), exclude_session="next").failures == 1
    # A normal exit from the block is a close(): the last step is saved.
    with AdaptiveCheckpointer(tmp_path, model=model, policy=FixedInterval(1e9)) as ck:
        ck.step(3)
    assert step_dirs(tmp_path) == [checkpoint_name(3)]


# -- configuration that may change ------------------------------------------------------------
def _saved_with(directory, config):
    model = torch.nn.Linear(2, 2)
    with AdaptiveCheckpointer(directory, model=model, config=config) as ck:
        ck.save(5)


def test_the_incompatible_config_error_names_every_differing_key_and_how_to_allow_them(tmp_path):
    old = {"lr": 0.1, "out": "/a", "data": {"path": "/d1", "seq": 512}, "tag": "x"}
    _saved_with(tmp_path, old)
    new = {"lr": 0.1, "out": "/b", "data": {"path": "/d2", "seq": 512}, "steps": 9, "tag": "x"}
    ck = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(2, 2), config=new)
    with pytest.raises(IncompatibleCheckpoint) as info:
        ck.restore()
    ck.close()
    message = str(info.value)
    assert "\n" not in message
    for part in (
        "data.path='/d1' in the checkpoint, '/d2' in this run",
        "out='/a' in the checkpoint, '/b' in this run",
        "steps=<absent> in the checkpoint, 9 in this run",
        "ignore_config_keys=('data.path', 'out', 'steps',)",
    ):
        assert part in message
    assert "lr" not in message and "seq" not in message
    ok = AdaptiveCheckpointer(
        tmp_path,
        model=torch.nn.Linear(2, 2),
        config=new,
        ignore_config_keys=("out", "data.path", "steps"),
    )
    assert ok.restore() == 5
    ok.close(finished=False)
    # Ignoring a parent name ignores what is under it; the rest is still checked.
    partial = AdaptiveCheckpointer(
        tmp_path, model=torch.nn.Linear(2, 2), config=new, ignore_config_keys=("data",)
    )
    with pytest.raises(IncompatibleCheckpoint, match=r"out=.*steps=") as info:
        partial.restore()
    partial.close()
    assert "data.path" not in str(info.value)


def test_life_cycle_arguments_are_checked_before_anything_is_written(tmp_path):
    model = torch.nn.Linear(2, 2)
    for kwargs, match in (
        ({"ignore_config_keys": "out"}, r"ignore_config_keys=\('out',\)"),
        ({"ignore_config_keys": ("out", 3)}, "non-empty string, got 3"),
        ({"on_preemption": "kill"}, "on_preemption"),
        ({"preemption_signals": (signal.SIGKILL,)}, "SIGKILL cannot be caught"),
        ({"preemption_signals": (9999,)}, "9999 is not a signal"),
    ):
        with pytest.raises(InputError, match=match):
            AdaptiveCheckpointer(tmp_path / "ck", model=model, **kwargs)
    assert not (tmp_path / "ck").exists()  # a refused launch leaves no session in a run log


# -- a log line per save, and stats that stay current -------------------------------------------
@pytest.mark.parametrize("async_save", [False, True])
def test_each_save_logs_step_tier_bytes_stall_and_next_due_step(tmp_path, caplog, async_save):
    caplog.set_level(logging.INFO, logger="simulator.controller")
    model = torch.nn.Linear(64, 64)
    ck = AdaptiveCheckpointer(
        tmp_path, model=model, policy=FixedInterval(1e9), async_save=async_save
    )
    ck.save(7)
    ck.close(finished=False)
    (record,) = [r for r in caplog.records if r.getMessage().startswith("saved step 7")]
    assert record.name == "simulator.controller" and record.levelno == logging.INFO
    manifest = json.loads((tmp_path / checkpoint_name(7) / ckptio.MANIFEST).read_text())
    size = sum(entry["bytes"] for entry in manifest["files"].values())
    assert size > 64 * 64 * 4
    assert (record.step, record.tier, record.bytes) == (7, "persistent", size)
    assert record.next_due_step == ck.stats["next_due_step"] > 7
    assert 0 < record.stall_s == pytest.approx(ck.stats["save_stall_s"])
    assert f"{size:,} bytes" in record.getMessage()


def test_stats_next_due_step_is_current_in_the_lightning_adapter(tmp_path):
    import lightning as L

    from simulator.controller.lightning import AdaptiveCheckpoint

    now = [0.0]

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            now[0] += 1.0  # one second of "compute" per step
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    seen = []

    class Watch(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            stats = callback.checkpointer.stats
            seen.append((trainer.global_step, stats["next_due_step"], stats["last_saved_step"]))

    callback = AdaptiveCheckpoint(
        tmp_path, policy=FixedInterval(3.0), clock=lambda: now[0], probe_steps=2
    )
    trainer = L.Trainer(
        max_steps=12, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[callback, Watch()],
    )  # fmt: skip
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(24, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), train_dataloaders=data)
    assert len(callback.saved_steps) >= 2
    for step, due, last in seen:
        assert due > step  # never a step already passed
        if last is not None:
            assert due > last
    assert callback.checkpointer.stats["next_due_step"] == callback.schedule.next_due_step


# -- preemption ---------------------------------------------------------------------------------
def test_sigterm_saves_the_step_reached_exits_75_and_the_relaunch_resumes_exactly(tmp_path):
    directory = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, str(_script(tmp_path)), str(directory), "400", "close"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(STEP_DELAY_S="0.01"),
    )  # fmt: skip
    printed = []
    try:
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("STEP 20"):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    printed.extend(out.splitlines(keepends=True))
    assert proc.returncode == PREEMPTED_EXIT_CODE == 75, err[-3000:]
    assert "DIGEST" not in "".join(printed)  # it did not run on to the end
    reached = int(lines("".join(printed), "STEP")[-1]) + 1  # step() saved it, then exited
    assert 20 < reached < 400
    assert step_dirs(directory) == [checkpoint_name(reached)]
    ckptio.verify_checkpoint(directory / checkpoint_name(reached))
    log = events(directory)
    assert [(e["event"], e.get("step")) for e in log][-2:] == [
        ("preempted", reached),
        ("stop", None),
    ]
    assert log[-2]["signal"] == "SIGTERM"
    assert f"preempted by SIGTERM: saved step {reached}" in err
    resumed = launch(tmp_path, directory, 400)
    assert lines(resumed.stdout, "START") == [f"{reached} False"]
    straight = launch(tmp_path, tmp_path / "straight", 400)
    assert lines(resumed.stdout, "DIGEST") == lines(straight.stdout, "DIGEST")
    evidence = failure_evidence(events(directory), exclude_session="next")
    assert (evidence.failures, evidence.sessions) == (0, 2)


def test_on_preemption_stop_returns_true_chains_the_old_handler_and_restores_it(tmp_path):
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    original = signal.signal(signal.SIGUSR1, previous)
    try:
        model = torch.nn.Linear(2, 2)
        ck = AdaptiveCheckpointer(
            tmp_path,
            model=model,
            policy=FixedInterval(1e9),
            preemption_signals=(signal.SIGUSR1,),
            on_preemption="stop",
        )
        assert signal.getsignal(signal.SIGUSR1) is not previous
        assert ck.step(1) is False
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.01)  # the handler runs on the main thread, between bytecodes
        assert calls == [signal.SIGUSR1]  # the previous handler still ran
        assert ck.preempted is False  # the handler only set a flag
        assert ck.step(2) is True and ck.preempted and ck.stats["preempted"]
        assert step_dirs(tmp_path) == [checkpoint_name(2)]
        assert ck.step(3) is False  # handled once; training could go on
        ck.close(finished=False)
        assert signal.getsignal(signal.SIGUSR1) is previous
        log = [(e["event"], e.get("step")) for e in events(tmp_path)]
        assert ("preempted", 2) in log and ("finished", 2) not in log
    finally:
        signal.signal(signal.SIGUSR1, original)


def test_a_checkpointer_made_off_the_main_thread_warns_and_installs_no_handler(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    caught, made = [], []

    def build():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            made.append(AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(2, 2)))
        caught.extend(str(x.message) for x in w)

    t = threading.Thread(target=build)
    t.start()
    t.join()
    assert any("main thread" in m and "SIGTERM" in m for m in caught)
    assert signal.getsignal(signal.SIGTERM) is before
    made[0].close()


_DROPPED = """
import gc, os, signal, sys, time, torch
from simulator.controller import AdaptiveCheckpointer
# Built and dropped without close(), as an adapter does to validate its arguments.
AdaptiveCheckpointer(sys.argv[1] + "/a", model=torch.nn.Linear(2, 2))
gc.collect()
if sys.argv[2] == "live":
    ck = AdaptiveCheckpointer(sys.argv[1] + "/b", model=torch.nn.Linear(2, 2), on_preemption="stop")
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
print("survived", sys.argv[2] == "live" and ck.step(1), flush=True)
"""


@pytest.mark.parametrize("then", ["nothing", "live"])
def test_a_dropped_checkpointers_handler_neither_swallows_nor_steals_the_signal(tmp_path, then):
    run = subprocess.run(
        [sys.executable, "-c", _DROPPED, str(tmp_path), then],
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    if then == "nothing":  # SIGTERM still does what it did before: the process dies of it
        assert run.returncode == -signal.SIGTERM and "survived" not in run.stdout
    else:  # the live checkpointer got it, chained through the dead one
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["survived", "True"]


_DDP_TRAIN = r"""
import hashlib, os, sys, time
import torch
import torch.distributed as dist
from simulator.controller import AdaptiveCheckpointer
from simulator.controller.distributed import DistributedBackend
from simulator.policies import FixedInterval

directory, steps = sys.argv[1], int(sys.argv[2])


def say(*parts):  # one write per line: two ranks share torchrun's stdout pipe
    os.write(1, (" ".join(map(str, parts)) + "\n").encode())


delay = float(os.environ.get("STEP_DELAY_S", "0"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
)
opt = torch.optim.AdamW(model.parameters(), lr=0.05)
torch.manual_seed(100 + rank)  # dropout differs per rank
now = [0.0]
ckpt = AdaptiveCheckpointer(
    directory, model=model, optimizer=opt, backend=DistributedBackend(),
    policy=FixedInterval(1e9), probe_steps=3, total_steps=steps,
    clock=lambda: now[0],  # a second per step on rank 0: a check point every 5 steps
)
step = ckpt.restore()
say("START", rank, step)
while step < steps:
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    step += 1
    now[0] += 1.0 if rank == 0 else 3.0
    ckpt.step(step)
    say("STEP", rank, step)
    time.sleep(delay)
ckpt.close()
h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
for s in opt.state_dict()["state"].values():
    h.update(s["exp_avg"].numpy().tobytes() + s["exp_avg_sq"].numpy().tobytes())
say("DIGEST", rank, h.hexdigest())
# Together, then out without destructors: freeing DDP's gloo group while unwinding can hang.
dist.barrier()
dist.destroy_process_group()
os._exit(0)
"""


def _torchrun(tmp_path: Path, directory: Path, steps: int, **env) -> subprocess.Popen:
    script = tmp_path / "ddp_train.py"
    script.write_text(_DDP_TRAIN)
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--max-restarts", "0", str(script), str(directory), str(steps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(**env),
    )  # fmt: skip


def _digests(out: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in lines(out, "DIGEST"))


@pytest.mark.slow
def test_sigterm_to_torchrun_saves_both_ranks_at_one_step_and_resumes_exactly(tmp_path):
    directory, steps = tmp_path / "ck", 300
    proc = _torchrun(tmp_path, directory, steps, STEP_DELAY_S="0.02")
    printed = []
    try:
        for line in proc.stdout:
            printed.append(line)
            if line.startswith("STEP 0 20"):
                proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every worker
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    printed = "".join(printed) + out
    assert proc.returncode != 0, "torchrun must not report a preempted job as finished"
    assert "DIGEST" not in printed
    log = events(directory)
    (preempted,) = [e for e in log if e["event"] == "preempted"]
    reached = preempted["step"]
    assert 20 < reached < steps
    assert step_dirs(directory) == [checkpoint_name(reached)]
    names = {p.name for p in (directory / checkpoint_name(reached)).iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp"} <= names
    # Each rank stopped at the agreed step: its last STEP line is the one before it.
    for rank in (0, 1):
        done = [int(s.split()[1]) for s in lines(printed, "STEP") if s.startswith(f"{rank} ")]
        assert done[-1] == reached - 1, (rank, done[-3:], reached)
    resumed = _torchrun(tmp_path, directory, steps)
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert sorted(lines(out, "START")) == [f"0 {reached}", f"1 {reached}"]
    straight = _torchrun(tmp_path, tmp_path / "straight", steps)
    ref, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    assert _digests(out) == _digests(ref) and len(_digests(ref)) == 2
    assert failure_evidence(events(directory), exclude_session="next").failures == 0


def test_the_framework_schedule_asks_for_a_save_after_a_signal_and_records_the_preemption(
    tmp_path,
):
    # The seam the Lightning and HF adapters use: is_due says "save now" after the signal,
    # record_save marks the checkpointer preempted; the adapter then stops its trainer.
    from simulator.controller.external import ExternalSaveSchedule

    now = [0.0]
    ck = AdaptiveCheckpointer(
        tmp_path,
        model=torch.nn.Linear(2, 2),
        policy=FixedInterval(1e9),
        clock=lambda: now[0],
        probe_steps=2,
        preemption_signals=(signal.SIGUSR1,),
    )
    schedule = ExternalSaveSchedule(ck)
    schedule.start(0)
    due = []
    for step in range(1, 6):
        now[0] += 1.0
        due.append(schedule.is_due(step))
        assert ck.stats["next_due_step"] == schedule.next_due_step
    assert not any(due) and schedule.next_due_step > 1000
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.01)
    assert schedule.is_due(6) is True and not ck.preempted
    schedule.record_save(6, stall_s=0.1)
    assert ck.preempted and ck.stats["last_saved_step"] == 6
    ck.close(finished=False)
    assert ("preempted", 6) in [(e["event"], e.get("step")) for e in events(tmp_path)]
    assert failure_evidence(events(tmp_path), exclude_session="next").failures == 0


def test_a_model_of_another_shape_is_refused_with_torchs_mismatches_in_the_message(tmp_path):
    # From the new-user review: the message ended at torch's heading ("... for Sequential:"),
    # the size mismatches under it cut off.
    from simulator.controller import IncompatibleCheckpoint

    small = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(4)))
    with AdaptiveCheckpointer(tmp_path, model=small, policy=FixedInterval(1e9)) as ck:
        ck.save(3)
        ck.close(finished=False)
    wide = torch.nn.Sequential(*(torch.nn.Linear(4 if i == 0 else 8, 8) for i in range(4)))
    ck = AdaptiveCheckpointer(tmp_path, model=wide, policy=FixedInterval(1e9))
    with pytest.raises(IncompatibleCheckpoint) as info:
        ck.restore()
    text = str(info.value)
    assert "\n" not in text and "for Sequential: size mismatch for 0.weight" in text
    assert "torch.Size([4, 4]) from checkpoint" in text and "(and 5 more)" in text
