"""The Lightning callback: saves at the policy's steps, atomically, and resumes identically.

A tiny LightningModule with dropout (so the RNG state matters) trains on a resumable loader;
a fake clock makes each step take one second, so FixedInterval(4 s) means one save every four
steps once the probe has measured the iteration time.
"""

from __future__ import annotations

import json
import warnings

# A hard import: `make test` installs the lightning extra, and CI must test the real library.
import lightning as L
import pytest
import torch

from simulator import ckptio
from simulator.controller.lightning import (
    CHECKPOINT_FILE,
    AdaptiveCheckpoint,
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


def _fit(directory, max_steps, ckpt_path=None, **options):
    clock = FakeClock()
    callback = AdaptiveCheckpoint(
        directory,
        policy=FixedInterval(INTERVAL_S),
        clock=clock,
        probe_steps=PROBE_STEPS,
        **options,
    )
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    model = Tiny(clock)
    torch.manual_seed(1)
    with warnings.catch_warnings():
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
    every = round(INTERVAL_S / 1.0)
    assert callback.saved_steps == list(range(PROBE_STEPS + every, 15, every))


def test_only_the_newest_complete_checkpoints_remain_and_they_verify(uninterrupted):
    directory, _, callback = uninterrupted
    kept = sorted(p.name for p in directory.iterdir() if p.name.startswith("step-"))
    assert kept == [f"step-{s:08d}" for s in callback.saved_steps[-2:]]
    assert not [p for p in directory.iterdir() if p.name.startswith(".tmp-")]
    for name in kept:
        ckptio.verify_checkpoint(directory / name)
    assert latest_checkpoint(directory) == directory / kept[-1] / CHECKPOINT_FILE


def test_resuming_from_what_it_wrote_continues_identically(uninterrupted, tmp_path):
    _, reference, _ = uninterrupted
    _fit(tmp_path, max_steps=8)  # "fails" after step 8; the last save was at step 6
    resume_from = latest_checkpoint(tmp_path)
    assert resume_from.parent.name == "step-00000006"
    resumed, callback = _fit(tmp_path, max_steps=14, ckpt_path=resume_from)
    for (name, want), got in zip(reference.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(want, got), name
    assert callback.checkpointer.resumed_from == 6
    # The schedule picks up where it was (estimates from the run log): no new probe.
    assert callback.saved_steps == [10, 14]


def test_a_damaged_newest_checkpoint_is_skipped_on_resume(tmp_path):
    _fit(tmp_path, max_steps=10)
    newest = tmp_path / "step-00000010" / CHECKPOINT_FILE
    newest.write_bytes(newest.read_bytes()[:-7])  # torn write
    with pytest.warns(UserWarning, match="older checkpoint"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step-00000006" / CHECKPOINT_FILE


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
