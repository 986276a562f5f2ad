"""The Hugging Face callback: Trainer saves exactly at the adaptive schedule's steps.

A GPT-2 built from a tiny config (no downloads) trains on random tokens; a fake clock makes each
step take one second, so FixedInterval(4 s) means one save every four steps once the probe has
measured the iteration time. A spy callback after ours records ``control.should_save``.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A hard import: `make test` installs the hf extra, and CI must test the real library.
import transformers

from simulator.controller.hf import AdaptiveSaveCallback
from simulator.policies import FixedInterval

INTERVAL_S = 4.0
PROBE_STEPS = 2
MAX_STEPS = 12


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tick(transformers.TrainerCallback):
    """Each optimizer step takes one second of the fake clock."""

    def __init__(self, clock):
        self.clock = clock

    def on_step_begin(self, args, state, control, **kwargs):
        self.clock.now += 1.0


class Spy(transformers.TrainerCallback):
    """Records the save flag after every callback before it has had its say."""

    def __init__(self):
        self.flags: dict[int, bool] = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.flags[state.global_step] = bool(control.should_save)


def _dataset(n: int = 64, length: int = 16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (n, length), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _train(output_dir, resume=None, save_total_limit=None):
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    clock = FakeClock()
    ours = AdaptiveSaveCallback(
        policy=FixedInterval(INTERVAL_S), clock=clock, probe_steps=PROBE_STEPS
    )
    spy = Spy()
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="no",
        save_total_limit=save_total_limit,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=_dataset(), callbacks=[Tick(clock), ours, spy]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train(resume_from_checkpoint=resume)
    return trainer, ours, spy


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("hf")
    return output_dir, *_train(output_dir)


def _expected_saves(first_step: int = 0) -> list[int]:
    every = round(INTERVAL_S / 1.0)
    start = PROBE_STEPS + every if first_step == 0 else first_step + every
    return list(range(start, MAX_STEPS + 1, every))


def test_should_save_is_set_exactly_at_the_due_steps(run):
    _, _, ours, spy = run
    due = _expected_saves()
    assert spy.flags == {s: s in due for s in range(1, MAX_STEPS + 1)}
    assert ours.requested_steps == due


def test_trainer_writes_a_checkpoint_at_each_due_step_and_reports_it(run):
    output_dir, _, ours, _ = run
    written = sorted(
        int(p.name.split("-")[1]) for p in output_dir.iterdir() if p.name.startswith("checkpoint-")
    )
    assert written == _expected_saves()
    assert ours.saved_steps == written
    assert ours.checkpointer.stats["saves"] == len(written)


def test_a_resumed_trainer_continues_the_schedule_from_its_step(run, tmp_path):
    output_dir, trainer, _, _ = run
    first = _expected_saves()[0]
    resumed, ours, spy = _train(output_dir, resume=str(output_dir / f"checkpoint-{first}"))
    assert min(spy.flags) == first + 1  # Trainer resumed after the checkpoint's step
    assert ours.requested_steps == _expected_saves(first_step=first)
    for (name, want), got in zip(
        trainer.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(want, got), name


def test_save_total_limit_keeps_only_the_newest_adaptive_checkpoints(tmp_path):
    _, ours, _ = _train(tmp_path, save_total_limit=1)
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")]
    assert left == [f"checkpoint-{ours.saved_steps[-1]}"]
    assert len(ours.saved_steps) > 1
