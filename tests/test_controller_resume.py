"""Bit-exact resume: a run SIGKILLed at random moments (during saves too) ends where an
uninterrupted run ends — every tensor torch.equal, every other value equal.

The training script is ``simulator.controller._demo_train`` (model, AdamW, cosine schedule,
AMP grad scaler, a seeded data stream, and draws from the Python, NumPy and torch RNGs). Each
kill is either at a random time or right after the script announces a save, plus a random
few milliseconds, so the kills land inside writes as well as between them.
"""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from simulator import ckptio

STEPS = 120


def launch(directory: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simulator.controller._demo_train",
            str(directory),
            "--steps",
            str(STEPS),
            "--out",
            str(out),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )


def run_to_end(directory: Path, out: Path, *extra: str) -> None:
    proc = launch(directory, out, *extra)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-2000:]
    assert stdout.rstrip().endswith("DONE")


def kill_somewhere(directory: Path, out: Path, rng: np.random.Generator, at_save: bool, *extra):
    """Start the script and SIGKILL it at a seeded random moment (just after a save began)."""
    proc = launch(directory, out, *extra)
    delay = rng.uniform(0.0, 0.03) if at_save else rng.uniform(0.0, 1.0)
    started = None
    try:
        for line in proc.stdout:
            if line.startswith("START"):
                started = time.monotonic()
                if not at_save:
                    time.sleep(delay)
                    break
            if line.startswith("SAVE") and at_save:
                time.sleep(delay)
                break
            if line.startswith("DONE"):
                break
    finally:
        proc.kill()  # SIGKILL: no cleanup, no atexit, no flush
        _, stderr = proc.communicate()
    assert started is not None, f"the script died before it started training: {stderr[-2000:]}"
    # A write cut short leaves its hidden temp directory behind (cleaned at the next restore);
    # an object store's caller (a URL for ``directory``) looks for its unfinished upload.
    if not isinstance(directory, Path):
        return False
    return directory.exists() and any(ckptio.is_temp_dir(p) for p in directory.iterdir())


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


def run_in_this_process(directory: Path, out: Path, *extra: str) -> None:
    """The uninterrupted reference, run here to save one interpreter start-up."""
    from simulator.controller import _demo_train

    threads = torch.get_num_threads()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())  # noqa: NPY002
    try:
        args = [str(directory), "--steps", str(STEPS), "--out", str(out), *extra]
        assert _demo_train.main(args) == 0
    finally:
        torch.set_num_threads(threads)
        random.setstate(rng[0])
        np.random.set_state(rng[1])  # noqa: NPY002
        torch.set_rng_state(rng[2])


def check_kill_and_resume(tmp_path: Path, kills: int, seed: int, extra: tuple = ()) -> int:
    """Kill-and-resume against an uninterrupted run; returns how many kills hit a write."""
    reference = tmp_path / "reference.pt"
    run_in_this_process(tmp_path / "uninterrupted", reference, *extra)
    rng = np.random.default_rng(seed)
    resumed = tmp_path / "resumed.pt"
    directory = tmp_path / "killed"
    inside_writes = 0
    for i in range(kills):
        inside_writes += kill_somewhere(directory, resumed, rng, i % 2 == 0, *extra)
        if resumed.exists():
            break  # finished before the kill landed
    run_to_end(directory, resumed, *extra)
    want = torch.load(reference, weights_only=True)
    got = torch.load(resumed, weights_only=True)
    for key in want:
        assert same(got[key], want[key]), f"{key} differs after kill-and-resume"
    assert want["data"]["served"] == STEPS  # the comparison covers the whole run
    return inside_writes


def test_a_run_killed_twice_once_inside_a_save_resumes_bit_exactly(tmp_path):
    check_kill_and_resume(tmp_path, kills=2, seed=1)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_killed_many_times_resumes_bit_exactly(tmp_path, mode):
    # Slow fsyncs keep each write open ~0.1 s, so kills sent 0-30 ms after a save is announced
    # land inside it however fast this machine's disk is.
    extra = ("--fsync-delay-s", "0.04") + (("--async-save",) if mode == "async" else ())
    hits = check_kill_and_resume(tmp_path, kills=10, seed=2 if mode == "sync" else 3, extra=extra)
    assert hits >= 1, "no kill landed inside a checkpoint write"
