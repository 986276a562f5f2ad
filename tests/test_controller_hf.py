"""The Hugging Face callback: Trainer saves at the adaptive schedule's steps; each save verifies.

A GPT-2 built from a tiny config (no downloads, dropout on) trains on random tokens; a fake clock
makes each step take one second, so FixedInterval(4 s) means one save every four steps once the
probe has measured the iteration time, plus the last step. A spy callback after ours records
``control.should_save``. The kill tests run Trainer in a child process (one, or two ranks under
torchrun with gloo) that SIGKILLs itself inside Trainer's own checkpoint write, then resume with
``resume_training`` and compare the final checkpoint with an uninterrupted run's, bit for bit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A hard import: `make test` installs the hf extra, and CI must test the real library.
import transformers
from _damage import flip_a_byte
from safetensors.torch import load_file

from simulator import ckptio
from simulator.controller.hf import (
    AdaptiveSaveCallback,
    NoIntactCheckpoint,
    RunFinished,
    latest_checkpoint,
    resume_training,
)
from simulator.errors import InputError
from simulator.policies import FixedInterval

INTERVAL_S = 4.0
PROBE_STEPS = 2
MAX_STEPS = 12
TESTS = Path(__file__).resolve().parent
_STATE = "trainer_state.json"


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
    """Records the save flag and the adaptive stats after every callback before it."""

    def __init__(self, ours):
        self.ours = ours
        self.flags: dict[int, bool] = {}
        self.next_due: dict[int, int] = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.flags[state.global_step] = bool(control.should_save)
        self.next_due[state.global_step] = self.ours.stats["next_due_step"]


class KillInSave(transformers.TrainerCallback):
    """SIGKILLs this process at the n-th save's ``on_save``, before the callbacks after it."""

    def __init__(self, nth: int):
        self.nth, self.seen = nth, 0

    def on_save(self, args, state, control, **kwargs):
        self.seen += 1
        if self.seen == self.nth:
            os.kill(os.getpid(), signal.SIGKILL)


class SignalAt(transformers.TrainerCallback):
    def __init__(self, step: int, sig=signal.SIGTERM):
        self.step, self.sig = step, sig

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.sig)


def _dataset(n: int = 64, length: int = 16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 64, (n, length), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


def _trainer(
    output_dir, *, save_total_limit=None, save_strategy="no", before=(), max_steps=None, rows=64
):
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    clock = FakeClock()
    ours = AdaptiveSaveCallback(
        policy=FixedInterval(INTERVAL_S), clock=clock, probe_steps=PROBE_STEPS
    )
    spy = Spy(ours)
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps or MAX_STEPS,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy=save_strategy,
        save_total_limit=save_total_limit,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=_dataset(rows),
        callbacks=[Tick(clock), *before, ours, spy],
    )
    return trainer, ours, spy


def _train(output_dir, resume=None, **kwargs):
    trainer, ours, spy = _trainer(output_dir, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if resume == "latest":
            resume_training(trainer)
        else:
            trainer.train(resume_from_checkpoint=resume)
    return trainer, ours, spy


def child_main(output_dir: str, kill_at_save: int, where: str, kill_rank: int) -> None:
    """A training process (or torchrun rank) that SIGKILLs itself inside a Trainer save.

    ``where``: "rng" dies in ``_save_rng_state`` (model and optimizer written, no RNG state nor
    trainer_state.json); "state" leaves a truncated ``trainer_state.json``; "marker" dies after
    Trainer's save and its rotation but before our marker. With ``kill_at_save`` 0 it trains to
    the end, resuming from the newest complete checkpoint.
    """
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    saves = [0]
    before = ()

    def dying(original, write_half=False):
        def wrapper(self, path, *args, **kwargs):
            saves[0] += 1
            if saves[0] == kill_at_save and rank == kill_rank:
                if write_half:
                    text = json.dumps(self.__dict__, default=str)
                    Path(path).write_text(text[: len(text) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, path, *args, **kwargs)

        return wrapper

    if where == "rng":
        transformers.Trainer._save_rng_state = dying(transformers.Trainer._save_rng_state)
    elif where == "state":
        transformers.TrainerState.save_to_json = dying(
            transformers.TrainerState.save_to_json, write_half=True
        )
    elif where == "marker" and rank == kill_rank:
        before = (KillInSave(kill_at_save),)
    trainer, ours, _ = _trainer(output_dir, before=before, save_total_limit=1)
    resume_training(trainer)
    # One write of the whole line (under PIPE_BUF, so atomic): print() may write the text and
    # its newline apart, and the other rank's Trainer output then lands inside the line.
    sys.stdout.flush()
    os.write(1, (json.dumps({"rank": rank, "saved": ours.saved_steps}) + "\n").encode())
    if dist.is_initialized():
        # Both ranks reach the teardown together (as torchrun scripts end): a rank tearing gloo
        # down while its peer is still leaving train() hung at exit on a loaded machine.
        dist.barrier()
        dist.destroy_process_group()
        # Then leave without running destructors: DDP still holds the gloo group, and freeing
        # it as this frame unwinds hung one rank for minutes on a loaded CI machine (its stack:
        # only <module>, inside C++ teardown; the torch teardown hangs of pytorch#75097 and
        # #109478). The checkpoints are committed and closed by now; the test reads the files.
        os._exit(0)


def _launch(output_dir, *, ranks: int, kill_at_save: int = 0, where="rng", kill_rank=0):
    code = (
        # A hang shows where it is: every thread's stack, then exit, before the timeout below.
        "import faulthandler; faulthandler.dump_traceback_later(180, exit=True); "
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
        "from test_controller_hf import child_main; "
        f"child_main({str(output_dir)!r}, {kill_at_save}, {where!r}, {kill_rank})"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    if ranks == 1:
        cmd = [sys.executable, "-c", code]
    else:
        script = Path(output_dir).parent / "child.py"
        script.write_text(code + "\n")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a rendezvous on a port of its own choosing, no race for one
            f"--nproc_per_node={ranks}",
            str(script),
        ]
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr.decode(errors="replace")[-4000:] if exc.stderr else ""
        pytest.fail(f"{' '.join(cmd)} hung; its stderr ends:\n{tail}")


def _final_state(output_dir) -> dict[str, torch.Tensor]:
    folder = Path(output_dir) / f"checkpoint-{MAX_STEPS}"
    ckptio.verify_checkpoint(folder)
    tensors = {f"model.{k}": v for k, v in load_file(folder / "model.safetensors").items()}
    optim = torch.load(folder / "optimizer.pt", weights_only=True)
    for pid, st in optim["state"].items():
        for k, v in st.items():
            tensors[f"optim.{pid}.{k}"] = torch.as_tensor(v)
    return tensors


def _assert_same(want: dict, got: dict) -> None:
    assert want.keys() == got.keys()
    differ = [k for k in want if not torch.equal(want[k], got[k])]
    assert not differ, f"{len(differ)} of {len(want)} tensors differ, e.g. {differ[:3]}"


# -- the schedule ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("hf")
    return output_dir, *_train(output_dir)


def _expected_saves(first_step: int = 0) -> list[int]:
    every = round(INTERVAL_S / 1.0)
    start = PROBE_STEPS + every if first_step == 0 else first_step + every
    due = list(range(start, MAX_STEPS + 1, every))
    return due if due[-1] == MAX_STEPS else [*due, MAX_STEPS]  # and the last step


def test_should_save_is_set_exactly_at_the_due_steps_and_the_last_step(run):
    _, _, ours, spy = run
    due = _expected_saves()
    assert spy.flags == {s: s in due for s in range(1, MAX_STEPS + 1)}
    assert ours.requested_steps == due[:-1]  # the last step's save is the final one


def test_stats_name_the_next_due_step_after_every_step(run):
    _, _, ours, spy = run
    every = round(INTERVAL_S / 1.0)
    # The step after the probe's end and after each save, the stats already name the next one.
    planned = [PROBE_STEPS, *ours.saved_steps[:-1]]
    assert {p + 1: spy.next_due[p + 1] for p in planned} == {p + 1: p + every for p in planned}
    assert ours.stats["next_due_step"] == ours.schedule.next_due_step > MAX_STEPS
    assert ours.stats["last_saved_step"] == MAX_STEPS


def test_trainer_writes_a_checkpoint_at_each_due_step_and_reports_it(run):
    output_dir, _, ours, _ = run
    written = sorted(int(p.name.split("-")[1]) for p in output_dir.glob("checkpoint-*"))
    assert written == _expected_saves()
    assert ours.saved_steps == written
    assert ours.checkpointer.stats["saves"] == len(written)


def test_every_checkpoint_folder_carries_a_marker_covering_all_its_files(run):
    output_dir, *_ = run
    for folder in output_dir.glob("checkpoint-*"):
        ckptio.verify_checkpoint(folder)
        listed = set(json.loads((folder / ckptio.MANIFEST).read_text())["files"])
        on_disk = {p.name for p in folder.iterdir()} - {ckptio.MANIFEST}
        assert listed == on_disk
        assert {"model.safetensors", "optimizer.pt", "rng_state.pth", _STATE} <= listed


def test_a_resumed_trainer_continues_the_schedule_from_its_step(run, tmp_path):
    output_dir, trainer, _, _ = run
    first = _expected_saves()[0]
    copy = tmp_path / "out"
    shutil.copytree(output_dir, copy)
    resumed, ours, spy = _train(copy, resume=str(copy / f"checkpoint-{first}"))
    assert min(spy.flags) == first + 1  # Trainer resumed after the checkpoint's step
    assert ours.saved_steps == _expected_saves(first_step=first)
    for (name, want), got in zip(
        trainer.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(want, got), name


def test_each_save_logs_one_line_with_step_bytes_stall_and_next_due(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="simulator.controller"):
        _, ours, _ = _train(tmp_path)
    lines = [r for r in caplog.records if r.getMessage().startswith("saved step")]
    assert [r.step for r in lines] == ours.saved_steps == _expected_saves()  # one line each
    for r in lines:
        folder = tmp_path / f"checkpoint-{r.step}"
        on_disk = sum(p.stat().st_size for p in folder.iterdir() if p.name != ckptio.MANIFEST)
        assert r.bytes == on_disk > 0
        assert f"saved step {r.step} (tier persistent): {on_disk:,} bytes, stall " in r.getMessage()
        assert r.getMessage().endswith(f"next due step {r.next_due_step}")


def test_save_strategy_steps_is_refused_in_one_line(tmp_path):
    with pytest.raises(InputError, match=r"save_strategy='steps'.*save_strategy='no'"):
        _trainer(tmp_path, save_strategy="steps")


# -- verifiable folders ------------------------------------------------------------------------
def test_latest_checkpoint_skips_torn_and_damaged_folders_and_names_each(run, tmp_path):
    output_dir, *_ = run
    out = tmp_path / "out"
    shutil.copytree(output_dir, out)
    newest = out / f"checkpoint-{MAX_STEPS}"
    torn = out / f"checkpoint-{MAX_STEPS + 4}"
    shutil.copytree(newest, torn)
    (torn / "trainer_state.json").unlink()  # what a kill during Trainer's save leaves
    unmarked = out / f"checkpoint-{MAX_STEPS + 8}"
    shutil.copytree(newest, unmarked)
    (unmarked / ckptio.MANIFEST).unlink()
    with open(newest / "model.safetensors", "r+b") as f:  # a flipped byte in the newest
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.warns(UserWarning) as caught:
        got = latest_checkpoint(out)
    assert got == str(out / f"checkpoint-{_expected_saves()[-2]}")
    reasons = [str(w.message) for w in caught]
    assert any(unmarked.name in r and "no completion marker" in r for r in reasons)
    assert any(torn.name in r and "trainer_state.json" in r for r in reasons)
    assert any(newest.name in r and "CRC-32" in r for r in reasons)


def test_latest_checkpoint_rejects_a_folder_whose_name_and_step_disagree(run, tmp_path):
    output_dir, *_ = run
    out = tmp_path / "out"
    shutil.copytree(output_dir, out)
    first = _expected_saves()[0]
    (out / f"checkpoint-{first}").rename(out / "checkpoint-99")
    with pytest.warns(UserWarning, match=f"checkpoint-99: trainer_state.json holds step {first}"):
        assert latest_checkpoint(out) == str(out / f"checkpoint-{MAX_STEPS}")


def test_latest_checkpoint_is_none_for_an_empty_or_missing_directory(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "absent") is None


def test_save_total_limit_keeps_the_newest_complete_and_deletes_nothing_it_did_not_write(
    tmp_path,
):
    # A torn folder left before this run (its own files, or a kill in someone's save) is not
    # known to be garbage: moved aside, byte for byte, never deleted. Was: deleted.
    torn = tmp_path / "checkpoint-5"
    torn.mkdir(parents=True)
    (torn / "model.safetensors").write_bytes(b"half")
    with pytest.warns(UserWarning, match=r"checkpoint-5.*moved aside.*never deleted"):
        trainer, ours, _ = _trainer(tmp_path, save_total_limit=1)
        trainer.train()
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert left == [f"checkpoint-{MAX_STEPS}", "checkpoint-5.rejected-unverified"]
    assert (tmp_path / left[1] / "model.safetensors").read_bytes() == b"half"
    assert len(ours.saved_steps) > 1
    assert latest_checkpoint(tmp_path) == str(tmp_path / f"checkpoint-{MAX_STEPS}")


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*/*")}


def test_every_checkpoint_damaged_refuses_a_silent_fresh_start_and_keeps_them(run, tmp_path):
    # Was: resume_training trained from step 1 without a word, and save_total_limit then
    # deleted the damaged folders.
    output_dir, *_ = run
    out = tmp_path / "out"
    shutil.copytree(output_dir, out)
    damaged = [f"checkpoint-{s}" for s in _expected_saves()]
    for name in damaged:
        flip_a_byte(out / name / "model.safetensors", 3)
    before = _files(out)
    trainer, ours, spy = _trainer(out, save_total_limit=1)
    with pytest.warns(UserWarning), pytest.raises(NoIntactCheckpoint) as refused:
        resume_training(trainer)
    message = str(refused.value)
    assert all(name in message for name in damaged) and "CRC-32" in message
    assert "allow_fresh_start=True" in message and "Nothing was deleted" in message
    assert spy.flags == {} and _files(out) == before  # not one step, not one byte changed

    # Starting over is the user's explicit choice; even then their folders are kept.
    with pytest.warns(UserWarning, match="moved aside"):
        resume_training(trainer, allow_fresh_start=True)
    assert min(spy.flags) == 1 and ours.saved_steps == _expected_saves()
    assert latest_checkpoint(out) == str(out / f"checkpoint-{MAX_STEPS}")
    for name in damaged:
        aside = out / f"{name}.rejected-unverified"
        for rel, data in before.items():
            if rel.startswith(name + "/"):
                assert (aside / rel.split("/", 1)[1]).read_bytes() == data
    # A relaunch of a directory whose every folder was moved aside refuses too.
    for folder in out.glob("checkpoint-*"):
        if ".rejected-" not in folder.name:
            shutil.rmtree(folder)  # the fresh run's own
    with pytest.raises(NoIntactCheckpoint, match="moved aside by an earlier launch"):
        latest_checkpoint(out)


def _copy(run, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(run[0], out)
    return out


def test_a_fresh_train_in_a_directory_with_checkpoints_is_refused_untouched(run, tmp_path):
    # A relaunch that forgot resume_training: Trainer would train from step 1 and write a
    # second history over the first.
    out = _copy(run, tmp_path)
    before = _files(out)
    trainer, _, spy = _trainer(out, save_total_limit=1)
    with pytest.raises(InputError, match=r"up to checkpoint-12.*no resume_from_checkpoint"):
        trainer.train()
    assert spy.flags == {} and _files(out) == before


@pytest.mark.parametrize("damage", ["bitflip", "bitflip-after-a-check", "misnamed", "symlink"])
def test_trainers_own_latest_lookup_is_checked_before_training(run, tmp_path, damage):
    # resume_from_checkpoint=True is Trainer's get_last_checkpoint: the highest number, checked
    # for nothing. A damaged newest, or a copy of step 6 named checkpoint-99, is refused before
    # a step, moved aside, and the relaunch resumes from the newest good folder.
    out = _copy(run, tmp_path)
    longer = MAX_STEPS + 4  # so the newest is no finished run's last step
    if damage.startswith("bitflip"):
        if damage == "bitflip-after-a-check":  # this process verified it a moment before
            assert latest_checkpoint(out) == str(out / f"checkpoint-{MAX_STEPS}")
        flip_a_byte(out / f"checkpoint-{MAX_STEPS}" / "model.safetensors", 3)
        bad, why = f"checkpoint-{MAX_STEPS}", "unverified"
    elif damage == "misnamed":
        shutil.copytree(out / "checkpoint-6", out / "checkpoint-99")
        bad, why = "checkpoint-99", "misnamed"
    else:  # another run's folder, linked in: Trainer follows the link, ckptsim does not
        other = _copy(run, tmp_path / "other")
        (out / "checkpoint-99").symlink_to(other / "checkpoint-6")
        bad, why = "checkpoint-99", "misnamed"
    trainer, _, spy = _trainer(out, max_steps=longer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(InputError, match=f"refusing to train on from .*{bad}.*relaunch"):
            trainer.train(resume_from_checkpoint=True)
    assert (out / f"{bad}.rejected-{why}").is_dir() and not (out / bad).exists()
    if damage == "symlink":  # the link itself moved aside; the other run's folder untouched
        assert (out / f"{bad}.rejected-{why}").is_symlink()
        assert _files(tmp_path / "other" / "out") == _files(run[0])
    assert {p.name for p in out.glob("checkpoint-*") if "rejected" not in p.name} == {
        f"checkpoint-{s}" for s in _expected_saves() if f"checkpoint-{s}" != bad
    }
    events = [json.loads(line)["event"] for line in (out / "runlog.jsonl").open()]
    assert events[-1] == "refused"
    trainer, ours, spy = _trainer(out, max_steps=longer)  # the relaunch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resume_training(trainer)
    start = 10 if damage.startswith("bitflip") else MAX_STEPS  # the newest good folder
    assert ours.stats["resumed_from"] == start and min(spy.flags) == start + 1
    assert ours.saved_steps[-1] == longer


def test_a_symlink_or_a_file_in_a_checkpoints_place_is_moved_aside_not_written_through(
    tmp_path,
):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "model.safetensors").write_bytes(b"someone else's weights")
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoint-10").symlink_to(precious)  # at a step this run will save
    (out / f"checkpoint-{MAX_STEPS}").write_text("not a folder")
    trainer, ours, _ = _trainer(out, save_total_limit=1)
    with pytest.warns(UserWarning, match="never deleted"):
        trainer.train()
    assert ours.saved_steps == _expected_saves()  # Trainer's own save of step 12 succeeded
    assert (precious / "model.safetensors").read_bytes() == b"someone else's weights"
    assert sorted(p.name for p in precious.iterdir()) == ["model.safetensors"]
    assert (out / "checkpoint-10.rejected-unverified").is_symlink()
    assert (out / f"checkpoint-{MAX_STEPS}.rejected-unverified").read_text() == "not a folder"


def test_an_epoch_save_at_the_step_the_adaptive_one_saved_is_not_written_twice(tmp_path):
    # 24 rows in batches of 4: epochs of 6 steps, and the first adaptive save is due at 6.
    trainer, ours, _ = _trainer(tmp_path, save_strategy="epoch", rows=24)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert ours.saved_steps == sorted(set(ours.saved_steps))  # each step saved once
    assert 6 in ours.saved_steps and MAX_STEPS in ours.saved_steps
    saves = [json.loads(line) for line in (tmp_path / "runlog.jsonl").open()]
    steps = [e["step"] for e in saves if e["event"] == "save"]
    assert steps == sorted(set(steps))


def test_save_strategy_best_is_refused_in_one_line(tmp_path):
    # Trainer sets should_save to "a new best" after the callbacks: every adaptive save, and
    # the final one, would be dropped while the run log said finished.
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=MAX_STEPS, save_strategy="best",
        eval_strategy="steps", eval_steps=4, metric_for_best_model="loss", report_to=[],
        use_cpu=True,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    )
    callback = AdaptiveSaveCallback(policy=FixedInterval(INTERVAL_S))
    with pytest.raises(InputError, match=r"save_strategy='best'.*overrule"):
        transformers.Trainer(
            model=model, args=args, train_dataset=_dataset(), eval_dataset=_dataset(8),
            callbacks=[callback],
        )  # fmt: skip


def test_a_resume_from_an_older_step_moves_the_newer_folders_aside_unchanged(run, tmp_path):
    # A deliberate roll-back (after a loss spike, say): Trainer would write its saves over the
    # newer folders and retention would delete them. They are moved aside, byte for byte.
    output_dir, *_ = run
    out = tmp_path / "out"
    shutil.copytree(output_dir, out)
    first, *newer = _expected_saves()
    before = _files(out)
    with pytest.warns(UserWarning) as caught:
        trainer, ours, _ = _trainer(out, save_total_limit=1)
        trainer.train(resume_from_checkpoint=str(out / f"checkpoint-{first}"))
    said = [str(w.message) for w in caught]
    for step in newer:
        assert any(f"checkpoint-{step}.rejected-newer" in m for m in said), said
        for rel, data in before.items():
            if rel.startswith(f"checkpoint-{step}/"):
                moved = out / rel.replace(f"checkpoint-{step}", f"checkpoint-{step}.rejected-newer")
                assert moved.read_bytes() == data
    assert ours.saved_steps == _expected_saves(first_step=first)


# -- the life cycle ----------------------------------------------------------------------------
def test_a_finished_run_relaunched_returns_at_once_with_its_trained_model(run, tmp_path):
    output_dir, *_ = run
    out = tmp_path / "out"
    shutil.copytree(output_dir, out)
    again, _, spy = _trainer(out)
    with pytest.warns(UserWarning, match=f"finished at step {MAX_STEPS}: nothing to train"):
        assert resume_training(again) is None
    assert spy.flags == {}  # not one step trained
    # From the new-user review: the script went on with the untrained model. The final
    # checkpoint's weights are loaded, so an evaluation or save_model after it is right.
    final = load_file(out / f"checkpoint-{MAX_STEPS}" / "model.safetensors")
    loaded = again.model.state_dict()
    assert final and all(torch.equal(loaded[k], v) for k, v in final.items())
    assert again.state.global_step == MAX_STEPS  # and the state that goes with them
    # By hand, Trainer would train a 13th step; the callback refuses instead.
    with pytest.raises(RunFinished, match="resume_training"):
        again.train(resume_from_checkpoint=latest_checkpoint(out))
    assert spy.flags == {}


def test_a_preemption_signal_saves_the_step_and_stops_trainer(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    trainer, ours, spy = _train(tmp_path, before=(SignalAt(3),))
    assert trainer.state.global_step == 3
    assert ours.preempted and ours.saved_steps == [3]
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    events = [json.loads(line)["event"] for line in (tmp_path / "runlog.jsonl").open()]
    assert "preempted" in events and events[-1] == "stop"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    _, resumed, spy = _train(tmp_path, resume="latest")
    assert min(spy.flags) == 4 and resumed.saved_steps[-1] == MAX_STEPS


def test_resume_training_exits_75_after_a_preemption_unless_asked_to_return(tmp_path):
    # From the new-user review: Trainer returned as if done, the process exited 0 (a completed
    # job to the scheduler) and the script's save_model after it saved a half-trained model.
    from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE

    trainer, ours, _ = _trainer(tmp_path / "a", before=(SignalAt(3),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SystemExit) as exit:
            resume_training(trainer)
    assert exit.value.code == PREEMPTED_EXIT_CODE and ours.preempted
    assert latest_checkpoint(tmp_path / "a") == str(tmp_path / "a" / "checkpoint-3")
    trainer, ours, _ = _trainer(tmp_path / "b", before=(SignalAt(3),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        output = resume_training(trainer, on_preemption="return")
    assert output.global_step == 3 and ours.preempted
    with pytest.raises(InputError, match="on_preemption must be one of 'exit', 'return'"):
        resume_training(trainer, on_preemption="stop")


# -- SIGKILL during a save, then resume ---------------------------------------------------------
@pytest.fixture(scope="module")
def reference(run):
    return _final_state(run[0])


@pytest.mark.parametrize("where", ["rng", pytest.param("state", marks=pytest.mark.slow), "marker"])
def test_a_kill_inside_a_trainer_save_resumes_to_the_uninterrupted_state(
    where, reference, tmp_path
):
    out = tmp_path / "out"
    killed = _launch(out, ranks=1, kill_at_save=2, where=where)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    second = out / f"checkpoint-{_expected_saves()[1]}"
    assert second.is_dir() and not (second / ckptio.MANIFEST).exists()
    with pytest.warns(UserWarning, match=f"skipping {second}"):
        assert latest_checkpoint(out) == str(out / f"checkpoint-{_expected_saves()[0]}")
    _, ours, _ = _train(out, resume="latest", save_total_limit=1)
    assert ours.saved_steps == _expected_saves(first_step=_expected_saves()[0])
    _assert_same(reference, _final_state(out))


def _two_rank_kill_and_resume(tmp_path, where, kill_rank):
    ref = _launch(tmp_path / "ref", ranks=2)
    assert ref.returncode == 0, ref.stderr[-3000:]
    out = tmp_path / "out"
    killed = _launch(out, ranks=2, kill_at_save=2, where=where, kill_rank=kill_rank)
    assert killed.returncode != 0
    second = out / f"checkpoint-{_expected_saves()[1]}"
    assert second.is_dir() and not (second / ckptio.MANIFEST).exists()
    with pytest.warns(UserWarning, match=f"skipping {second}"):
        assert latest_checkpoint(out) == str(out / f"checkpoint-{_expected_saves()[0]}")
    resumed = _launch(out, ranks=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    saved = [json.loads(line) for line in resumed.stdout.splitlines() if line.startswith('{"rank"')]
    assert [s["saved"] for s in saved] == [_expected_saves(first_step=_expected_saves()[0])] * 2
    _assert_same(_final_state(tmp_path / "ref"), _final_state(out))
    rng = {p.name for p in (out / f"checkpoint-{MAX_STEPS}").glob("rng_state_*.pth")}
    assert rng == {"rng_state_0.pth", "rng_state_1.pth"}


def test_two_ranks_killed_while_rank_one_writes_its_rng_state_resume_exactly(tmp_path):
    # Rank 0 has written everything and waits for rank 1: only the barrier keeps its marker
    # from vouching for a folder without rank 1's RNG state.
    _two_rank_kill_and_resume(tmp_path, "rng", kill_rank=1)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["state", "marker"])
def test_two_ranks_killed_in_rank_zeros_save_resume_exactly(tmp_path, where):
    _two_rank_kill_and_resume(tmp_path, where, kill_rank=0)
