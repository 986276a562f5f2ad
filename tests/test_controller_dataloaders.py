"""Exact resume through the data loaders people use: a torch DataLoader and torchdata's
StatefulDataLoader, shuffled, with and without worker processes, a model with dropout, on one
process and on two torchrun/gloo ranks, and nanoGPT's prefetch-after-backward loop.

Each case is a real kill-and-resume: the training script (``tests/loader_train.py``, or the
README's "In training" example itself) SIGKILLs its own process right after a fixed step, is
launched again, and must end with parameters, optimizer state and RNG states bit-identical to
an uninterrupted run's. With 8 batches per epoch and saves at steps 5, 8 and 14, the kills
resume mid-epoch 0 into epoch 1, from the very end of epoch 0, and mid-epoch 1 into epoch 2.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _dist import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("loader_train.py")
SAVE_AT = "5,8,14"
# kill after step -> the step the next launch resumes from
KILLS = {7: 5, 11: 8, 18: 14}
STEPS = 24  # 3 epochs of 64 samples in batches of 8
ENV = {**os.environ, "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT)}


def _launch(command: list[str], *, killed: bool, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=300, cwd=cwd, env=ENV, check=False
    )
    if killed:
        assert proc.returncode != 0 and "DONE" not in proc.stdout, proc.stdout[-500:]
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.rstrip().endswith("DONE")
    return proc.stdout


def _script(directory: Path, out: Path, *args: str, ranks: int = 1) -> list[str]:
    head = [sys.executable]
    if ranks > 1:
        head += ["-m", "torch.distributed.run", f"--nproc_per_node={ranks}"]
        head += [f"--master_port={free_port()}", "--tee=3"]
    return [*head, str(SCRIPT), str(directory), "--out", str(out), *args]


def _in_this_process(run, *args) -> None:
    """The uninterrupted reference, run here to save an interpreter start-up (~5 s)."""
    threads = torch.get_num_threads()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    try:
        run(*args)
    finally:
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])  # noqa: NPY002
        torch.set_rng_state(rng[2])


def _reference_script(directory: Path, out: Path, *args: str) -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import loader_train
    finally:
        sys.path.remove(str(SCRIPT.parent))
    with contextlib.redirect_stdout(None):
        assert loader_train.main([str(directory), "--out", str(out), *args]) == 0


def _starts(stdout: str) -> list[int]:
    return [int(s) for s in re.findall(r"^(?:\[\w+\]:)?START (\d+)$", stdout, re.MULTILINE)]


def _assert_same_final_state(reference: Path, resumed: Path, ranks: int = 1, steps=STEPS):
    for r in range(ranks):
        want = torch.load(reference / f"rank{r}.pt", weights_only=True)
        got = torch.load(resumed / f"rank{r}.pt", weights_only=True)
        assert got["step"] == want["step"] == steps
        for k, v in want["model"].items():
            assert torch.equal(v, got["model"][k]), f"rank {r}: parameter {k} differs"
        assert want["optimizer"]["state"].keys() == got["optimizer"]["state"].keys()
        for i, s in want["optimizer"]["state"].items():
            for name, v in s.items():
                assert torch.equal(v, got["optimizer"]["state"][i][name]), (r, i, name)
        assert torch.equal(want["rng_torch"], got["rng_torch"]), f"rank {r}: torch RNG differs"
        assert want["rng_python"] == got["rng_python"]
        assert want["rng_numpy"] == got["rng_numpy"]


def _kill_and_resume(
    tmp_path: Path,
    kills: list[int],
    *args: str,
    ranks: int = 1,
    save_at: str = SAVE_AT,
    resumes: dict[int, int] = KILLS,
    steps: int = STEPS,
) -> None:
    """An uninterrupted run, then one killed after each step in ``kills`` and resumed."""
    save = ("--save-at", save_at)
    if ranks == 1:
        _in_this_process(_reference_script, tmp_path / "ref", tmp_path / "ref-out", *save, *args)
    else:
        reference = _script(tmp_path / "ref", tmp_path / "ref-out", *save, *args, ranks=ranks)
        _launch(reference, killed=False)
    directory, out = tmp_path / "ckpt", tmp_path / "out"
    starts = []
    for kill in kills:
        command = _script(directory, out, *save, "--kill-at", str(kill), *args, ranks=ranks)
        starts += _starts(_launch(command, killed=True))
    starts += _starts(_launch(_script(directory, out, *save, *args, ranks=ranks), killed=False))
    # Each launch resumed from the last save before the previous kill (every rank alike).
    expected = [0] + [resumes[k] for k in kills]
    assert starts == [s for s in expected for _ in range(ranks)]
    _assert_same_final_state(tmp_path / "ref-out", out, ranks, steps)


# -- one process ----------------------------------------------------------------------------
def test_a_stateful_dataloader_killed_mid_epoch_resumes_into_the_next_epoch_bit_exactly(tmp_path):
    _kill_and_resume(tmp_path, [18], "--loader", "stateful", "--workers", "0")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["torch", "stateful"])
def test_every_loader_and_worker_count_resumes_bit_exactly_across_epochs(tmp_path, kind, workers):
    _kill_and_resume(tmp_path, list(KILLS), "--loader", kind, "--workers", str(workers))


def test_a_batch_prefetched_before_the_step_ended_comes_back_after_a_kill(tmp_path):
    # nanoGPT's loop: get_batch draws from the torch RNG right after backward; the batch in
    # hand at a save is the next step's, and it lives in ckpt.extra["batch"].
    _kill_and_resume(tmp_path, [11], "--prefetch")


# -- two ranks ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "workers"), [("torch", 0), ("torch", 2), ("stateful", 2)])
def test_two_ddp_ranks_with_a_distributed_sampler_resume_bit_exactly(tmp_path, kind, workers):
    _kill_and_resume_ddp(tmp_path, "--loader", kind, "--workers", str(workers))


@pytest.mark.slow
def test_two_ddp_ranks_with_a_dataloader_resume_bit_exactly_across_an_epoch(tmp_path):
    _kill_and_resume_ddp(tmp_path, "--loader", "torch", "--workers", "0", kills=[6])


def _kill_and_resume_ddp(tmp_path: Path, *args: str, kills=(6, 9)) -> None:
    # 32 samples per rank, 4 batches per epoch: saves at the end of epoch 0 and mid-epoch 1.
    _kill_and_resume(
        tmp_path,
        list(kills),
        "--ddp",
        *args,
        ranks=2,
        save_at="4,7",
        resumes={6: 4, 9: 7},
        steps=12,
    )


# -- the README's own example ----------------------------------------------------------------
def readme_training_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## In training\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


_HARNESS = textwrap.dedent(
    """
    import os, random, signal, sys
    import numpy as np, torch
    from simulator.controller import checkpointer

    save_at, kill_at, code = {save_at!r}, {kill_at!r}, {code!r}
    policy_step = checkpointer.AdaptiveCheckpointer.step

    def step(self, n):  # saves at fixed steps, then the policy's; a SIGKILL after kill_at
        saved = self.save(n) if n in save_at else policy_step(self, n)
        if n == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return saved

    checkpointer.AdaptiveCheckpointer.step = step
    torch.set_num_threads(1)
    random.seed(0)  # the example seeds torch only; these are compared too
    np.random.seed(0)
    run = {{"__name__": "__main__"}}
    exec(compile(code, "README.md", "exec"), run)
    np_state = np.random.get_state()
    os.makedirs("out", exist_ok=True)
    torch.save(
        {{
            "step": run["step"],
            "model": run["model"].state_dict(),
            "optimizer": run["opt"].state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_python": random.getstate(),
            "rng_numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
        }},
        "out/rank0.pt",
    )
    print("DONE", flush=True)
    """
)


def _harness(kill_at: int | None) -> str:
    code = readme_training_example().replace(
        "step = ckpt.restore()", "step = ckpt.restore(); print('START', step, flush=True)"
    )
    return _HARNESS.format(save_at={5, 8, 14}, kill_at=kill_at, code=code)


def _readme_run(workdir: Path, kill_at: int | None) -> str:
    workdir.mkdir(parents=True, exist_ok=True)
    return _launch(
        [sys.executable, "-c", _harness(kill_at)], killed=kill_at is not None, cwd=workdir
    )


def _readme_in_this_process(workdir: Path) -> None:
    from simulator.controller import checkpointer

    workdir.mkdir(parents=True, exist_ok=True)
    policy_step = checkpointer.AdaptiveCheckpointer.step
    with contextlib.chdir(workdir), contextlib.redirect_stdout(None):
        try:
            exec(compile(_harness(None), "harness", "exec"), {"__name__": "harness"})
        finally:
            checkpointer.AdaptiveCheckpointer.step = policy_step


def test_the_readme_training_example_resumes_bit_exactly_into_the_next_epoch(tmp_path):
    code = readme_training_example()
    # What the example claims to show, so that the run below exercises it.
    for needed in ("DataLoader(", "shuffle=True", "num_workers=2", "Dropout(", "ckpt.wrap("):
        assert needed in code, needed
    _in_this_process(_readme_in_this_process, tmp_path / "reference")
    starts = _starts(_readme_run(tmp_path / "killed", 11))
    starts += _starts(_readme_run(tmp_path / "killed", None))
    assert starts == [0, 8]  # killed in epoch 0, resumed from its very end into epoch 1
    _assert_same_final_state(tmp_path / "reference" / "out", tmp_path / "killed" / "out")


# -- clear errors -----------------------------------------------------------------------------
def _dataset():
    return torch.utils.data.TensorDataset(torch.arange(16.0).view(16, 1))


def test_a_torch_dataloader_given_as_dataloader_is_refused_with_what_to_do(tmp_path):
    from simulator.controller import AdaptiveCheckpointer
    from simulator.errors import InputError

    loader = torch.utils.data.DataLoader(_dataset(), batch_size=4, shuffle=True)
    with pytest.raises(InputError, match=r"ckpt\.wrap\(loader\)"):
        AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1), dataloader=loader)


def test_wrapping_after_restore_or_a_persistent_worker_loader_is_refused(tmp_path):
    from simulator.controller import AdaptiveCheckpointer
    from simulator.errors import InputError

    model = torch.nn.Linear(1, 1)
    first = AdaptiveCheckpointer(tmp_path, model=model)
    first.wrap(torch.utils.data.DataLoader(_dataset(), batch_size=4))
    first.save(1)
    first.close()
    again = AdaptiveCheckpointer(tmp_path, model=model)
    again.wrap(torch.utils.data.DataLoader(_dataset(), batch_size=4))
    assert again.restore() == 1
    with pytest.raises(InputError, match=r"before ckpt\.restore"):
        again.wrap(torch.utils.data.DataLoader(_dataset(), batch_size=4))
    again.close()
    persistent = torch.utils.data.DataLoader(
        _dataset(), batch_size=4, num_workers=1, persistent_workers=True
    )
    fresh = AdaptiveCheckpointer(tmp_path / "other", model=model)
    with pytest.raises(InputError, match="persistent_workers"):
        fresh.wrap(persistent)
    fresh.close()


def test_an_extra_value_that_cannot_be_stored_is_one_clear_error(tmp_path):
    from simulator.controller import AdaptiveCheckpointer, CheckpointWriteError
    from simulator.errors import InputError

    ckpt = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1), extra={"f": len})
    with pytest.raises(CheckpointWriteError, match=r"extra\['f'\] is a builtin_function") as e:
        ckpt.save(1)
    assert isinstance(e.value.__cause__, InputError)
    assert "\n" not in str(e.value)
    ckpt.close()


def test_extra_keeps_nested_tensors_and_gives_them_back_after_restore(tmp_path):
    from simulator.controller import AdaptiveCheckpointer

    batch = {"x": torch.randn(3, 2), "ys": [torch.arange(3), (torch.ones(1), 7)], "tag": "b"}
    ckpt = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1), extra={"batch": None})
    ckpt.extra["batch"] = batch
    ckpt.save(3)
    ckpt.close()
    again = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1), extra={"batch": None})
    assert again.restore() == 3
    got = again.extra["batch"]
    assert torch.equal(got["x"], batch["x"]) and torch.equal(got["ys"][0], batch["ys"][0])
    assert torch.equal(got["ys"][1][0], batch["ys"][1][0]) and got["ys"][1][1] == 7
    assert type(got["ys"][1]) is tuple and got["tag"] == "b"
    again.close()


def _epochs_of_batches(tmp_path: Path, epochs: int, save_first: bool) -> list[torch.Tensor]:
    from simulator.controller import AdaptiveCheckpointer

    torch.manual_seed(3)
    ckpt = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1))
    loader = ckpt.wrap(torch.utils.data.DataLoader(_dataset(), batch_size=4, shuffle=True))
    ckpt.restore()
    if save_first:
        ckpt.save(0)
    seen = [x for _ in range(loader.epoch, epochs) for (x,) in loader]
    ckpt.close()
    return seen


def test_a_save_before_the_first_epoch_resumes_as_the_fresh_start_it_was(tmp_path):
    _epochs_of_batches(tmp_path / "saved", 0, save_first=True)  # saved, never iterated
    resumed = _epochs_of_batches(tmp_path / "saved", 2, save_first=False)
    fresh = _epochs_of_batches(tmp_path / "fresh", 2, save_first=False)
    assert len(resumed) == len(fresh) == 8
    assert all(torch.equal(a, b) for a, b in zip(resumed, fresh, strict=True))


def _draws_over_epochs(directory: Path, generator: str, save_at: int, stop_at: int | None):
    """Batches and a dropout-like draw per step over 3 epochs; stops (unclosed) at stop_at.

    ``generator``: "" (global RNG only), "loader" (``DataLoader(generator=g)``) or
    "batch_sampler" (``batch_sampler=BatchSampler(RandomSampler(generator=g))``).
    """
    from simulator.controller import AdaptiveCheckpointer

    torch.manual_seed(3)  # as a fresh process would
    g = torch.Generator().manual_seed(9) if generator else None
    ckpt = AdaptiveCheckpointer(directory, model=torch.nn.Linear(1, 1))
    if generator == "batch_sampler":
        sampler = torch.utils.data.RandomSampler(_dataset(), generator=g)
        batches = torch.utils.data.BatchSampler(sampler, batch_size=4, drop_last=False)
        data = torch.utils.data.DataLoader(_dataset(), batch_sampler=batches)
    else:
        data = torch.utils.data.DataLoader(_dataset(), batch_size=4, shuffle=True, generator=g)
    loader = ckpt.wrap(data)
    step, seen = ckpt.restore(), []
    for _ in range(loader.epoch, 3):
        for (x,) in loader:
            seen.append((x, torch.rand(2)))
            step += 1
            if step == save_at:
                ckpt.save(step)
            if step == stop_at:
                ckpt.close()
                return seen
    ckpt.close()
    return [*seen, (torch.get_rng_state(), g.get_state() if g is not None else None)]


@pytest.mark.parametrize("generator", ["", "loader", "batch_sampler"])
def test_the_shuffle_and_the_draws_after_it_continue_as_if_never_stopped(tmp_path, generator):
    # Saved mid-epoch 1 (step 6, 4 per epoch), stopped in epoch 2: the resume redoes epoch 1's
    # last batches and epoch 2, with the loader's or its batch sampler's own generator if it
    # has one (whose state at epoch 1's start is not its seed's).
    whole = _draws_over_epochs(tmp_path / "whole", generator, save_at=0, stop_at=None)
    _draws_over_epochs(tmp_path / "cut", generator, save_at=6, stop_at=9)
    resumed = _draws_over_epochs(tmp_path / "cut", generator, save_at=0, stop_at=None)
    assert len(resumed) == len(whole) - 6 == 7
    for a, b in zip(whole[6:], resumed, strict=True):
        assert all(x is y or torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_iterating_the_wrapped_loader_twice_in_an_epoch_is_said_once(tmp_path):
    # Peeking with next(iter(loader)) counts an epoch: a resume's range(loader.epoch, epochs)
    # then ends the run early (and close() marks it finished), so the first one is named.
    from simulator.controller import AdaptiveCheckpointer

    ckpt = AdaptiveCheckpointer(tmp_path, model=torch.nn.Linear(1, 1))
    loader = ckpt.wrap(torch.utils.data.DataLoader(_dataset(), batch_size=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):  # whole epochs: nothing to say
            for _batch in loader:
                pass
    with pytest.warns(UserWarning, match=r"epoch 2 was left after 1 of 4 batches") as caught:
        for _ in range(2):
            next(iter(loader))
            for _batch in loader:
                pass
    assert len(caught) == 1
    ckpt.close()
