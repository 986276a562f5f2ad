"""The Lightning callback: saves at the policy's steps, atomically, and resumes identically.

A tiny LightningModule with dropout (so the RNG state matters) trains on a resumable loader;
a fake clock makes each step take one second, so FixedInterval(4 s) means one save every four
steps once the probe has measured the iteration time. The kill-and-resume tests run the real
script ``tests/_lightning_run.py`` (a shuffled torchdata StatefulDataLoader) in subprocesses,
SIGTERMed and SIGKILLed there, on one process and on two DDP ranks (Lightning's own launcher).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

# A hard import: `make test` installs the lightning extra, and CI must test the real library.
import lightning as L
import pytest
import torch
from _damage import flip_a_byte
from _dist import rank_results

from simulator import ckptio
from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE
from simulator.controller.lightning import (
    CHECKPOINT_FILE,
    AdaptiveCheckpoint,
    NoIntactCheckpoint,
    latest_checkpoint,
)
from simulator.errors import InputError
from simulator.policies import FixedInterval

INTERVAL_S = 4.0
PROBE_STEPS = 2
BATCHES_PER_EPOCH = 5  # saves fall mid-epoch, where resuming is hardest


class ResumableLoader:
    """A fixed sequence of batches that remembers its position (Lightning saves it)."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(BATCHES_PER_EPOCH, 8, 4, generator=g)
        self.y = torch.randn(BATCHES_PER_EPOCH, 8, 1, generator=g)
        self.pos = 0

    def __len__(self) -> int:
        return BATCHES_PER_EPOCH

    def __iter__(self):
        if self.pos >= BATCHES_PER_EPOCH:  # Lightning stops at len() without exhausting us
            self.pos = 0
        while self.pos < BATCHES_PER_EPOCH:
            i = self.pos
            self.pos += 1
            yield self.x[i], self.y[i]
        self.pos = 0

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


class Tiny(L.LightningModule):
    def __init__(self, clock):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1)
        )
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.now += 1.0  # one second of "compute" per step
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StopAt(L.Callback):
    """Asks the Trainer to stop after ``step`` steps, as EarlyStopping does."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.should_stop = True


def _fit(directory, ckpt_path=None, *, quiet=True, callbacks=(), **limits):
    clock = FakeClock()
    callback = AdaptiveCheckpoint(
        directory, policy=FixedInterval(INTERVAL_S), clock=clock, probe_steps=PROBE_STEPS
    )
    trainer = L.Trainer(
        **({"max_steps": 14} | limits),
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback, *callbacks],
    )
    model = Tiny(clock)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore")
        trainer.fit(model, train_dataloaders=ResumableLoader(), ckpt_path=ckpt_path)
    return model, callback


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lightning")
    model, callback = _fit(directory, max_steps=14)
    return directory, model, callback


def test_saves_at_the_steps_the_fixed_interval_gives(uninterrupted):
    _, _, callback = uninterrupted
    # Every 4 steps after the 2-step probe: 6, then 10, the last batch of the second 5-batch
    # epoch, where a save would make Lightning skip the next epoch on resume, so it waits for
    # 11; then the last step, 14, saved when training ends.
    assert callback.saved_steps == [6, 11, 14]


def test_stats_say_when_the_next_save_is_due(uninterrupted):
    _, _, callback = uninterrupted
    # After the final save at step 14 the schedule plans the next one interval later.
    assert callback.next_due_step == 14 + round(INTERVAL_S)
    assert callback.stats["next_due_step"] == callback.next_due_step
    assert callback.stats["saves"] == 3
    assert callback.stats["last_saved_step"] == 14


def test_stats_are_current_after_every_save(tmp_path):
    seen = {}

    class Watch(L.Callback):  # runs after AdaptiveCheckpoint: it comes later in the list
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            (ours,) = [c for c in trainer.callbacks if isinstance(c, AdaptiveCheckpoint)]
            seen[trainer.global_step] = ours.stats["next_due_step"]

    _fit(tmp_path, max_steps=9, callbacks=[Watch()])
    assert seen[6] == 10  # planned at the save after step 6
    assert seen[5] == 6  # planned at the probe's end, step 2


def test_no_save_logs_or_warns_about_weights_only(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, callback = _fit(tmp_path, quiet=False, max_steps=14)
    assert len(callback.saved_steps) == 3
    said = [r.getMessage() for r in caplog.records] + [str(w.message) for w in caught]
    assert said  # the capture works: Lightning does log at INFO
    assert not [m for m in said if "weights_only" in m]


def test_only_the_newest_complete_checkpoints_remain_and_they_verify(uninterrupted):
    directory, _, callback = uninterrupted
    kept = sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))
    assert kept == [f"step-{s:08d}" for s in callback.saved_steps[-2:]]
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
    for name in kept:
        ckptio.verify_checkpoint(directory / name)
    assert latest_checkpoint(directory) == directory / kept[-1] / CHECKPOINT_FILE


@pytest.mark.parametrize(
    ("limits", "stop_at", "last"),
    [
        ({"max_steps": 13}, None, 13),
        ({"max_steps": -1, "max_epochs": 2}, None, 2 * BATCHES_PER_EPOCH),
        ({"max_steps": 20}, 7, 7),  # a requested stop, as EarlyStopping makes
    ],
    ids=["max_steps", "max_epochs", "should_stop"],
)
def test_a_finished_run_saves_its_last_step_and_a_relaunch_trains_nothing(
    tmp_path, caplog, limits, stop_at, last
):
    stopper = [StopAt(stop_at)] if stop_at else []
    first, callback = _fit(tmp_path, callbacks=stopper, **limits)
    assert callback.saved_steps[-1] == last
    assert latest_checkpoint(tmp_path).parent.name == f"step-{last:08d}"
    events = [json.loads(line) for line in (tmp_path / "runlog.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("step")) for e in events[-2:]] == [
        ("finished", last),
        ("stop", None),
    ]

    with caplog.at_level(logging.INFO, logger="simulator.controller"):
        again, callback = _fit(tmp_path, latest_checkpoint(tmp_path), callbacks=stopper, **limits)
    assert again.clock.now == 0.0  # not one training step
    assert callback.finished
    assert f"already finished at step {last}" in caplog.text
    for want, got in zip(first.parameters(), again.parameters(), strict=True):
        assert torch.equal(want, got)


def test_a_damaged_newest_checkpoint_is_skipped_on_resume_and_moved_aside(tmp_path):
    _fit(tmp_path, max_steps=10)
    newest = tmp_path / "step-00000010" / CHECKPOINT_FILE
    newest.write_bytes(newest.read_bytes()[:-7])  # torn write
    with pytest.warns(UserWarning, match="older checkpoint"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step-00000006" / CHECKPOINT_FILE
    # Resumed from step 6 with keep_last=2, the run saves 10 again, then 11 and 14: the
    # damaged step 10 is moved aside at the start, so neither that save nor retention drops it.
    with pytest.warns(UserWarning, match=r"step-00000010.*moved aside.*never deleted"):
        _, callback = _fit(
            tmp_path, tmp_path / "step-00000006" / CHECKPOINT_FILE, max_steps=14, quiet=False
        )
    assert callback.stats["resumed_from"] == 6
    assert (tmp_path / "step-00000010.rejected-corrupt" / CHECKPOINT_FILE).is_file()


def _tree(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "step-" in str(p)
    }


def test_every_checkpoint_damaged_refuses_a_silent_fresh_start_and_keeps_them(tmp_path):
    # Was: latest_checkpoint gave None, fit started from step 0, and retention then deleted
    # the damaged checkpoints (a silent restart that loses the run).
    _fit(tmp_path, max_steps=10)
    damaged = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert damaged == ["step-00000006", "step-00000010"]
    for name in damaged:
        flip_a_byte(tmp_path / name / CHECKPOINT_FILE)
    before = _tree(tmp_path)
    with pytest.warns(UserWarning), pytest.raises(NoIntactCheckpoint) as refused:
        latest_checkpoint(tmp_path)
    message = str(refused.value)
    assert all(name in message for name in damaged) and "CRC-32" in message
    assert "allow_fresh_start=True" in message and "Nothing was deleted" in message
    assert _tree(tmp_path) == before

    # Starting over is the user's explicit choice, and even then nothing of theirs is deleted.
    with pytest.warns(UserWarning):
        assert latest_checkpoint(tmp_path, allow_fresh_start=True) is None
    _, callback = _fit(tmp_path, None, max_steps=14)
    assert callback.stats["resumed_from"] is None and callback.saved_steps == [6, 11, 14]
    aside = sorted(p.name for p in tmp_path.iterdir() if ".rejected-" in p.name)
    assert aside == [f"{name}.rejected-corrupt" for name in damaged]
    for name in damaged:  # byte for byte what was there, under the new name
        for rel, data in before.items():
            if rel.startswith(name + "/"):
                moved = tmp_path / rel.replace(name, f"{name}.rejected-corrupt", 1)
                assert moved.read_bytes() == data
    assert latest_checkpoint(tmp_path).parent.name == "step-00000014"


def test_a_newer_verified_folder_that_is_no_lightning_checkpoint_is_kept(tmp_path):
    # latest_checkpoint skips it; the resumed run's save of that step replaced it. Was: deleted.
    from simulator.controller.integrity import write_manifest

    _fit(tmp_path, max_steps=10)
    foreign = tmp_path / "step-00000014"
    foreign.mkdir()
    (foreign / "notes.bin").write_bytes(b"someone's")
    write_manifest(foreign)
    with pytest.warns(UserWarning, match="not a Lightning checkpoint"):
        chosen = latest_checkpoint(tmp_path)
    assert chosen.parent.name == "step-00000010"
    with pytest.warns(UserWarning, match=r"step-00000014.*moved aside.*never deleted"):
        _, callback = _fit(tmp_path, chosen, max_steps=14, quiet=False)
    assert callback.saved_steps == [14]
    assert (tmp_path / "step-00000014.rejected-foreign" / "notes.bin").read_bytes() == b"someone's"


def test_a_resume_reads_the_restored_checkpoint_for_its_checksums_once(tmp_path, monkeypatch):
    # latest_checkpoint verifies it; the callback's look at the newer ones must not read it
    # again (a second full read of a checkpoint of hundreds of GB at every launch).
    _fit(tmp_path, max_steps=10)
    chosen = latest_checkpoint(tmp_path)
    read = []
    verify = ckptio.verify_checkpoint
    monkeypatch.setattr(
        ckptio, "verify_checkpoint", lambda d, *a, **k: (read.append(d), verify(d, *a, **k))[1]
    )
    _fit(tmp_path, chosen, max_steps=14)
    assert chosen.parent not in read


def test_a_relaunch_after_the_damaged_were_moved_aside_still_refuses(tmp_path):
    _fit(tmp_path, max_steps=8)
    for p in tmp_path.glob("step-*"):
        p.rename(tmp_path / f"{p.name}.rejected-corrupt")  # what an earlier launch did
    with pytest.raises(NoIntactCheckpoint, match="moved aside by an earlier launch"):
        latest_checkpoint(tmp_path)


def test_a_copy_whose_name_says_a_later_step_is_set_aside_before_training(tmp_path):
    # A step-00000090 holding step 6 would win every resume; retention would then delete the
    # newer checkpoints. The step inside is known once Lightning restores it: refused then.
    _fit(tmp_path, max_steps=10)
    (tmp_path / "step-00000006").rename(tmp_path / "step-00000090")
    chosen = latest_checkpoint(tmp_path)
    assert chosen.parent.name == "step-00000090"
    with pytest.raises(InputError, match=r"holds step 6, its name says 90.*relaunch to resume"):
        _fit(tmp_path, chosen, max_steps=14)
    assert (tmp_path / "step-00000090.rejected-misnamed" / CHECKPOINT_FILE).is_file()
    events = [json.loads(line)["event"] for line in (tmp_path / "runlog.jsonl").open()]
    assert events[-1] == "refused"
    _, callback = _fit(tmp_path, latest_checkpoint(tmp_path), max_steps=14)  # the relaunch
    assert callback.stats["resumed_from"] == 10 and callback.saved_steps == [14]


def test_each_save_logs_one_line_with_step_bytes_stall_and_next_due(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="simulator.controller"):
        _, callback = _fit(tmp_path, max_steps=10)
    lines = [r for r in caplog.records if r.getMessage().startswith("saved step")]
    assert [r.step for r in lines] == callback.saved_steps == [6, 10]
    for r in lines:
        on_disk = sum(
            p.stat().st_size
            for p in (tmp_path / f"step-{r.step:08d}").iterdir()
            if p.name != ckptio.MANIFEST
        )
        assert r.bytes == on_disk > 0
        assert f"saved step {r.step} (tier persistent): {on_disk:,} bytes, stall " in r.getMessage()
        assert r.getMessage().endswith(f"next due step {r.next_due_step}")


def test_the_run_log_records_each_save(uninterrupted):
    directory, _, callback = uninterrupted
    lines = (directory / callback.checkpointer.runlog.path.name).read_text().splitlines()
    saves = [e["step"] for e in map(json.loads, lines) if e["event"] == "save"]
    assert saves == callback.saved_steps


def test_bad_options_fail_when_the_callback_is_made(tmp_path):
    with pytest.raises(InputError, match="keep_last"):
        AdaptiveCheckpoint(tmp_path, keep_last=0)
    with pytest.raises(InputError, match="total_steps"):
        AdaptiveCheckpoint(tmp_path, milestones=(0.5,))


# -- what Lightning's defaults and a user's own ckpt_path do -------------------------------
def test_a_fresh_start_in_a_directory_with_checkpoints_is_refused(tmp_path):
    _fit(tmp_path, max_steps=8)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(InputError, match=r"up to step-00000008.*no ckpt_path.*latest_checkpoint"):
        _fit(tmp_path, max_steps=14)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written over


def test_resuming_from_anything_but_the_newest_checkpoint_is_refused(tmp_path):
    _fit(tmp_path, max_steps=8)
    older = tmp_path / "step-00000006" / CHECKPOINT_FILE
    with pytest.raises(InputError, match=r"step-00000006.*not the newest.*\(step-00000008\)"):
        _fit(tmp_path, older, max_steps=14)


def test_a_checkpoint_from_elsewhere_may_start_an_empty_directory(tmp_path):
    _fit(tmp_path / "a", max_steps=8)
    _, callback = _fit(tmp_path / "b", latest_checkpoint(tmp_path / "a"), max_steps=12)
    assert callback.stats["resumed_from"] == 8
    assert callback.saved_steps == [12]


def test_lightnings_default_model_checkpoint_runs_alongside_with_a_warning(tmp_path):
    clock = FakeClock()
    callback = AdaptiveCheckpoint(tmp_path / "ck", policy=FixedInterval(INTERVAL_S), clock=clock)
    trainer = L.Trainer(
        max_steps=6,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path / "lightning",
        callbacks=[callback],
    )  # enable_checkpointing=True, Lightning's default
    with pytest.warns(UserWarning, match="enable_checkpointing=False"):
        trainer.fit(Tiny(clock), train_dataloaders=ResumableLoader())
    assert callback.saved_steps == [6]
    assert list((tmp_path / "lightning").rglob("*.ckpt"))  # Lightning's own saves happened too


# -- kill and resume: the real script, real signals ----------------------------------------
SCRIPT = Path(__file__).with_name("_lightning_run.py")


def _launch(directory: Path, out: Path, *args: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    # This tree's simulator, whatever the caller's working directory.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(directory), str(out), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the training script hung:\n{output[-3000:]}")
    return proc.returncode, output


def _results(out: Path, world: int) -> list[dict]:
    return rank_results(out, world, weights_only=True)


def _assert_identical(reference: list[dict], resumed: list[dict]) -> None:
    for ref, got in zip(reference, resumed, strict=True):
        assert ref["global_step"] == got["global_step"]
        for step, batch in got["seen"].items():  # the same data after the resume
            assert torch.equal(ref["seen"][step], batch), step
        for k in ref["model"]:
            assert torch.equal(ref["model"][k], got["model"][k]), k
        assert ref["optimizer"].keys() == got["optimizer"].keys()
        for i, state in ref["optimizer"].items():
            for name, value in state.items():
                assert torch.equal(value, got["optimizer"][i][name]), (i, name)
        assert torch.equal(ref["rng"], got["rng"])


def _events(directory: Path) -> list[tuple[str, int | None]]:
    lines = (directory / "runlog.jsonl").read_text().splitlines()
    return [(e["event"], e.get("step")) for e in map(json.loads, lines)]


# One process: 10 batches an epoch (the save due at step 10 then waits for 11), 2 epochs.
ONE = ("--samples", "40")


def test_a_sigtermed_then_sigkilled_run_resumes_bit_identically(tmp_path):
    reference = _launch(tmp_path / "ref", tmp_path / "ref-out", *ONE)
    directory = tmp_path / "ck"
    # A scheduler's SIGTERM after step 8: Lightning stops at the batch's end, the callback
    # saves step 8 once, records the preemption, and fit ends with Lightning's SystemExit,
    # whose status the callback makes the plain loop's preemption status (Lightning's is 0:
    # "completed" to SLURM and torchrun).
    rc, output = _finish(_launch(directory, tmp_path / "p", *ONE, "--sigterm-at", "8"))
    assert rc == PREEMPTED_EXIT_CODE, output
    assert "step 8 saved in" in output and "exiting with status 75" in output  # and says so
    (preempted,) = _results(tmp_path / "p", 1)
    assert preempted["preempted"] and preempted["global_step"] == 8
    assert preempted["saved_steps"] == [6, 8]
    assert _events(directory)[-3:] == [("save", 8), ("preempted", 8), ("stop", None)]
    # Relaunched, it resumes at 8, saves at 12 and 16, and dies by SIGKILL after step 14.
    rc, output = _finish(_launch(directory, tmp_path / "k", *ONE, "--kill-at", "14"))
    assert rc == -signal.SIGKILL, output
    assert latest_checkpoint(directory).parent.name == "step-00000012"
    rc, output = _finish(_launch(directory, tmp_path / "r", *ONE))
    assert rc == 0, output
    resumed = _results(tmp_path / "r", 1)
    assert resumed[0]["resumed_from"] == 12
    rc, output = _finish(reference)
    assert rc == 0, output
    assert _results(tmp_path / "ref-out", 1)[0]["saved_steps"] == [6, 11, 15, 19, 20]
    _assert_identical(_results(tmp_path / "ref-out", 1), resumed)
    # Neither the preemption nor the relaunches count as failures; the SIGKILL does.
    from simulator.controller.runlog import failure_evidence, read_events

    assert failure_evidence(read_events(directory / "runlog.jsonl")).failures == 1


@pytest.mark.slow  # three two-process Lightning runs: about a minute of CPU
def test_a_sigkilled_two_rank_ddp_run_resumes_bit_identically(tmp_path):
    # 10 batches an epoch on each rank (torchdata's StatefulDistributedSampler), 2 epochs.
    two = ("--devices", "2", "--samples", "80")
    reference = _launch(tmp_path / "ref", tmp_path / "ref-out", *two)
    directory = tmp_path / "ck"
    # Saves at 6 and 11 (10 is an epoch's last batch); every rank dies after step 8, so the
    # resumed run redoes 7 and 8 and crosses the epoch boundary.
    rc, output = _finish(_launch(directory, tmp_path / "k", *two, "--kill-at", "8"))
    assert rc != 0, output
    assert latest_checkpoint(directory).parent.name == "step-00000006"
    rc, output = _finish(_launch(directory, tmp_path / "r", *two))
    assert rc == 0, output
    resumed = _results(tmp_path / "r", 2)
    assert [r["resumed_from"] for r in resumed] == [6, 6]
    rc, output = _finish(reference)
    assert rc == 0, output
    reference = _results(tmp_path / "ref-out", 2)
    assert [r["saved_steps"] for r in reference] == [[6, 11, 15, 19, 20]] * 2
    # The ranks' dropout streams differ, so each rank's own RNG state came back.
    assert not torch.equal(reference[0]["rng"], reference[1]["rng"])
    _assert_identical(reference, resumed)
