"""The controller under torch.distributed: two gloo ranks on CPU, DCP checkpoints, exact resume.

Each scenario runs in two real processes (``torch.multiprocessing.spawn``) that train a small
model with dropout (so each rank's RNG stream matters) on data that differs per rank — wrapped
in DDP (every rank holds all of it) or sharded with FSDP2's ``fully_shard`` (each rank holds
half of every parameter and of its AdamW moments, as DTensors) — and write what they saw,
gathered to full tensors, to files the test then checks.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _dist import fork_ranks, free_port, timed_outcome

WORLD = 2
STEPS = 20
INTERVAL_S = 5.0
PROBE_STEPS = 2
# Each rank's fake clock runs at its own pace; only rank 0's decides. Rank 1 alone would
# save every round(5 / 3) = 2 steps, so agreement on rank 0's steps comes from the broadcast.
SECONDS_PER_STEP = (1.0, 3.0)
_COLLECTIVES = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "barrier",
    "all_reduce",
    "broadcast",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
)


def _init(rank: int, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # A deadlock fails the test in a minute, not gloo's default 30.
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    torch.set_num_threads(1)


def _count_collectives() -> list[int]:
    """Wrap torch.distributed's Python collectives with a shared call counter."""
    calls = [0]
    for name in _COLLECTIVES:
        original = getattr(dist, name)

        def counted(*args, _original=original, **kwargs):
            calls[0] += 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    return calls


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)


def _wrap(model: torch.nn.Module, wrap: str) -> torch.nn.Module:
    """DDP, or FSDP2: each Linear its own shard group, then the whole model."""
    if wrap == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Model and optimizer state with FQN keys and whole tensors (a collective: every rank)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    clone = lambda v: v.detach().clone() if torch.is_tensor(v) else v  # noqa: E731
    return (
        {k: clone(v) for k, v in msd.items()},
        {k: {n: clone(v) for n, v in st.items()} for k, st in osd["state"].items()},
    )


def _train_worker(
    rank: int,
    port: int,
    root: str,
    out: str,
    stop_at: int | None,
    roundtrip: str | None,
    wrap: str = "ddp",
) -> None:
    """Train to STEPS (or SIGKILL itself after ``stop_at``), resuming from ``root`` if it can.

    With ``roundtrip`` (a folder), first check a DCP write/read of complete state there.
    """
    from simulator.controller import AdaptiveCheckpointer
    from simulator.controller.distributed import DistributedBackend
    from simulator.policies import FixedInterval

    _init(rank, port)
    if roundtrip is not None:
        _dcp_roundtrip(rank, roundtrip)
    wrap, _, mode = wrap.partition("+")  # "ddp+async": asynchronous saves
    ddp = _wrap(_model(), wrap)
    opt = torch.optim.AdamW(ddp.parameters(), lr=0.05)
    torch.manual_seed(100 + rank)  # dropout differs per rank
    now = [0.0]
    ckpt = AdaptiveCheckpointer(
        root,
        model=ddp,
        optimizer=opt,
        policy=FixedInterval(INTERVAL_S),
        backend=DistributedBackend(),
        clock=lambda: now[0],
        probe_steps=PROBE_STEPS,
        keep_last=2,
        async_save=mode == "async",
    )
    calls = _count_collectives()
    start = ckpt.restore()
    saves, collective_steps = [], []
    for step in range(start + 1, STEPS + 1):
        x, y = _batch(rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now[0] += SECONDS_PER_STEP[rank]
        before = calls[0]
        if ckpt.step(step):
            saves.append(step)
        if calls[0] != before:
            collective_steps.append(step)
        if step == stop_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush: a crash
    ckpt.close()
    rng = torch.get_rng_state()  # before the gathers below, which draw nothing but may
    model_state, optim_state = _full_state(ddp, opt)
    torch.save(
        {
            "start": start,
            "saves": saves,
            "collective_steps": collective_steps,
            "model": model_state,
            "optimizer": optim_state,
            "rng": rng,
            "sharded": [type(p).__name__ for p in ddp.parameters()],
        },
        Path(out) / f"rank{rank}.pt",
    )
    # Together, then out without destructors: DDP still holds the gloo group, and freeing it
    # as the frame unwinds hung a rank for minutes in CI (the HF two-rank child, stop 19).
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _run(
    root: Path,
    out: Path,
    stop_at: int | None = None,
    roundtrip: Path | None = None,
    wrap: str = "ddp",
) -> list[dict]:
    roundtrip = None if roundtrip is None else str(roundtrip)
    args = (free_port(), str(root), str(out), stop_at, roundtrip, wrap)
    return fork_ranks(_train_worker, args, WORLD, out, killed_ok=stop_at is not None)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Path, list[dict]]:
    base = tmp_path_factory.mktemp("ddp")
    return base, _run(base / "ckpt", base / "out", roundtrip=base / "roundtrip" / "ck")


def test_all_ranks_save_at_rank_zeros_steps_spaced_by_the_policy(uninterrupted):
    _, results = uninterrupted
    saves = [r["saves"] for r in results]
    assert saves[0] == saves[1]
    # After the probe, FixedInterval(5 s) at rank 0's 1 s per step: one save every 5 steps.
    steps_per_save = round(INTERVAL_S / SECONDS_PER_STEP[0])
    expected = list(range(PROBE_STEPS + steps_per_save, STEPS + 1, steps_per_save))
    assert saves[0] == expected


def test_collectives_run_only_at_saves_and_the_probe(uninterrupted):
    _, results = uninterrupted
    for r in results:
        assert set(r["collective_steps"]) <= set(r["saves"]) | {PROBE_STEPS}
        assert set(r["saves"]) <= set(r["collective_steps"])
        assert len(r["collective_steps"]) <= len(r["saves"]) + 1 < STEPS


def test_checkpoints_are_dcp_directories_with_a_file_per_rank(uninterrupted):
    base, results = uninterrupted
    root = base / "ckpt"
    kept = sorted(p.name for p in root.iterdir() if p.name.startswith("step-"))
    # close() saved the last step too (the run finished between the policy's saves).
    assert kept == [f"step-{s:08d}" for s in [*results[0]["saves"], STEPS][-2:]]
    newest = root / kept[-1]
    names = {p.name for p in newest.iterdir()}
    assert ".metadata" in names
    assert {f"__{r}_0.distcp" for r in range(WORLD)} <= names


def _dcp_roundtrip(rank: int, folder: str) -> None:
    from simulator.controller.distributed import DistributedBackend
    from simulator.controller.state import capture_state, restore_state

    backend = DistributedBackend()
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    torch.manual_seed(7 + rank)
    # The legacy global NumPy RNG is part of what the controller saves, so it is set here.
    np.random.seed(70 + rank)  # noqa: NPY002
    for step in range(3):
        x, y = _batch(rank, step)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    state = capture_state(step=3, model=model, optimizer=opt)
    backend.write(Path(folder), state)
    want = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "torch_rng": torch.get_rng_state().clone(),
        "numpy_rng": np.random.get_state()[1].copy(),  # noqa: NPY002
    }

    fresh = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
    )
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.05)  # no state yet
    torch.manual_seed(12345)
    np.random.seed(12345)  # noqa: NPY002
    template = capture_state(step=0, model=fresh, optimizer=fresh_opt)
    step = restore_state(backend.read(Path(folder), template), model=fresh, optimizer=fresh_opt)
    got = fresh_opt.state_dict()
    same = (
        step == 3
        and all(torch.equal(v, fresh.state_dict()[k]) for k, v in want["model"].items())
        and got["param_groups"] == want["optimizer"]["param_groups"]
        and got["state"].keys() == want["optimizer"]["state"].keys()
        and all(
            torch.equal(v, got["state"][i][name])
            for i, s in want["optimizer"]["state"].items()
            for name, v in s.items()
        )
        and torch.equal(torch.get_rng_state(), want["torch_rng"])
        and np.array_equal(np.random.get_state()[1], want["numpy_rng"])  # noqa: NPY002
    )
    torch.save(
        {"same": same, "rng": want["torch_rng"]}, Path(folder).parent / f"roundtrip{rank}.pt"
    )


def test_dcp_state_round_trips_bit_exactly_with_each_ranks_own_rng(uninterrupted):
    base, _ = uninterrupted
    results = [torch.load(base / "roundtrip" / f"roundtrip{r}.pt") for r in range(WORLD)]
    assert all(r["same"] for r in results)
    # The ranks' RNG streams differ, so a per-rank value survived DCP's deduplication.
    assert not torch.equal(results[0]["rng"], results[1]["rng"])


def _kill_resume_and_compare(reference: list[dict], tmp_path: Path, wrap: str) -> None:
    # A seeded moment between two saves, so the resumed run redoes the steps after the last one.
    between = [s for s in range(PROBE_STEPS + 6, STEPS) if s not in reference[0]["saves"]]
    stop_at = int(np.random.default_rng(2026).choice(between))
    root = tmp_path / "ckpt"
    assert _run(root, tmp_path / "killed", stop_at=stop_at, wrap=wrap) == []
    resumed = _run(root, tmp_path / "resumed", wrap=wrap)
    assert all(0 < r["start"] < stop_at for r in resumed)
    _assert_bit_exact(reference, resumed)


def _assert_bit_exact(reference: list[dict], resumed: list[dict]) -> None:
    """Every rank's model, optimizer and RNG state equal the uninterrupted run's, bit for bit."""
    for ref, got in zip(reference, resumed, strict=True):
        assert ref["model"].keys() == got["model"].keys()
        for k in ref["model"]:
            assert torch.equal(ref["model"][k], got["model"][k]), k
        assert ref["optimizer"].keys() == got["optimizer"].keys()
        for k, s in ref["optimizer"].items():
            for name, v in s.items():
                assert torch.equal(v, got["optimizer"][k][name]), (k, name)
        assert torch.equal(ref["rng"], got["rng"])


def test_a_killed_and_resumed_two_rank_run_ends_bit_identical(uninterrupted, tmp_path):
    _kill_resume_and_compare(uninterrupted[1], tmp_path, "ddp")


def test_asynchronous_saves_under_torch_distributed_resume_bit_identical(uninterrupted, tmp_path):
    # The background thread's DCP collectives ran on the training thread's group, whose next
    # collective (the due step's broadcast) met them in another order on each rank: a hang.
    _kill_resume_and_compare(uninterrupted[1], tmp_path, "ddp+async")


def test_a_killed_and_resumed_fsdp2_sharded_run_ends_bit_identical(tmp_path):
    reference = _run(tmp_path / "ref-ckpt", tmp_path / "ref", wrap="fsdp2")
    # Really sharded: every parameter a DTensor, each rank's checkpoint file its own half.
    assert all(set(r["sharded"]) == {"DTensor"} for r in reference)
    newest = max((tmp_path / "ref-ckpt").glob("step-*"))
    sizes = [(newest / f"__{r}_0.distcp").stat().st_size for r in range(WORLD)]
    assert min(sizes) > 0
    _kill_resume_and_compare(reference, tmp_path / "killed-run", "fsdp2")


@pytest.fixture
def one_rank():
    """A one-process gloo group in this process: enough for DCP's file handling."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


class _Payload:
    """A pickle that would create a file when loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_tampered_dcp_metadata_is_refused_without_running_it(one_rank, tmp_path):
    from simulator.controller.distributed import DistributedBackend
    from simulator.controller.integrity import UnsafeCheckpoint

    backend = DistributedBackend()
    backend.write(tmp_path / "ck", {"model": {"w": torch.ones(3)}, "step": 1})
    marker = tmp_path / "executed"
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UnsafeCheckpoint, match="touch"):
        backend.read(tmp_path / "ck", {"model": {"w": torch.zeros(3)}, "step": 0})
    assert not marker.exists()


def test_a_dcp_directory_without_metadata_reads_as_corrupt(one_rank, tmp_path):
    from simulator.controller.distributed import DistributedBackend
    from simulator.controller.integrity import CorruptCheckpoint

    backend = DistributedBackend()
    backend.write(tmp_path / "ck", {"model": {"w": torch.ones(3)}, "step": 1})
    (tmp_path / "ck" / ".metadata").unlink()
    with pytest.raises(CorruptCheckpoint, match="metadata"):
        backend.read(tmp_path / "ck", {"model": {"w": torch.zeros(3)}, "step": 0})


def test_non_tensor_values_come_back_with_their_types(one_rank, tmp_path):
    from simulator.controller.distributed import DistributedBackend

    backend = DistributedBackend()
    values = {"betas": (0.9, 0.99), "name": "adamw", "blob": b"\x00\x01", "n": 3, "none": None}
    backend.write(tmp_path / "ck", {"extra": values, "w": torch.arange(4.0)})
    got = backend.read(tmp_path / "ck", {"extra": {}, "w": torch.zeros(4)})
    assert got["extra"] == values
    assert type(got["extra"]["betas"]) is tuple
    assert torch.equal(got["w"], torch.arange(4.0))


@pytest.mark.parametrize("own", [False, True], ids=["shared", "rank-own"])
def test_entries_the_template_lacks_come_back_at_the_top_level_too(one_rank, tmp_path, own):
    # The controller's estimates and the local tier's run id are saved but not in a fresh
    # run's template; dcp.load copies the dict's top level, so they once vanished there.
    from simulator.controller.distributed import DistributedBackend

    backend = DistributedBackend()
    write, read = (backend.write_own, backend.read_own) if own else (backend.write, backend.read)
    saved = {"w": torch.arange(3.0), "controller": {"stall_s": 1.5}, "tiered": {"run_id": "ab"}}
    write(tmp_path / "ck", {**saved, "step": 4})
    got = read(tmp_path / "ck", {"w": torch.zeros(3), "step": 0})
    assert got["controller"] == {"stall_s": 1.5} and got["tiered"] == {"run_id": "ab"}
    assert got["step"] == 4 and torch.equal(got["w"], torch.arange(3.0))


def test_importing_the_controller_and_its_integrations_loads_no_framework():
    code = (
        "import sys, simulator.controller, simulator.controller.distributed;"
        "print(sorted(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_distributed_backend_needs_an_initialised_process_group():
    from simulator.controller.distributed import DistributedBackend
    from simulator.errors import InputError

    with pytest.raises(InputError, match="init_process_group"):
        DistributedBackend()


def test_a_dcp_checkpoint_whose_name_disagrees_with_its_step_is_rejected(one_rank, tmp_path):
    import shutil

    from simulator.controller import AdaptiveCheckpointer
    from simulator.controller.distributed import DistributedBackend
    from simulator.policies import FixedInterval

    def checkpointer(model):
        return AdaptiveCheckpointer(
            tmp_path, model=model, backend=DistributedBackend(), policy=FixedInterval(1e9)
        )

    model = torch.nn.Linear(3, 3)
    with checkpointer(model) as ck:
        for step in (3, 5):
            with torch.no_grad():
                model.weight.add_(1.0)
            ck.save(step)
    assert not (tmp_path / "step-00000005" / "meta.json").exists()  # the step is in DCP's files
    shutil.copytree(tmp_path / "step-00000003", tmp_path / "step-00000009")
    again = torch.nn.Linear(3, 3)
    ck = checkpointer(again)
    with pytest.warns(UserWarning, match="holds step 3, its name says 9"):
        assert ck.restore() == 5
    ck.close()
    assert torch.equal(again.weight, model.weight)
    assert (tmp_path / "step-00000009.rejected-misnamed").is_dir()


def _open_locked_directory(rank: int, port: int, root: str, out: str) -> None:
    from simulator.controller import AdaptiveCheckpointer
    from simulator.controller.distributed import DistributedBackend
    from simulator.controller.integrity import CheckpointLocked

    _init(rank, port)
    try:
        AdaptiveCheckpointer(root, model=torch.nn.Linear(2, 2), backend=DistributedBackend())
        result = "opened"
    except CheckpointLocked as exc:
        result = str(exc)
    (Path(out) / f"rank{rank}.txt").write_text(result)
    dist.destroy_process_group()


def test_every_rank_is_refused_when_another_run_holds_the_directory(tmp_path):
    from simulator.controller import AdaptiveCheckpointer

    root = tmp_path / "ckpt"
    holder = AdaptiveCheckpointer(root, model=torch.nn.Linear(2, 2))  # the job still running
    try:
        args = (free_port(), str(root), str(tmp_path))
        mp.start_processes(_open_locked_directory, args=args, nprocs=WORLD, start_method="fork")
    finally:
        holder.close()
    for r in range(WORLD):  # rank 0 tried the lock; rank 1 heard its verdict
        assert (
            f"in use by another run (pid {os.getpid()} on"
            in (tmp_path / f"rank{r}.txt").read_text()
        )


def _restore_while_rank_zero_cannot_read(
    rank: int, port: int, root: str, out: str, where: str
) -> None:
    import errno

    from simulator.controller import AdaptiveCheckpointer, checkpointer
    from simulator.controller.distributed import DistributedBackend

    def failing_disk(*_args, **_kwargs):
        raise OSError(errno.EIO, "Input/output error")

    _init(rank, port)
    if rank == 0 and where == "choosing":  # a failing disk as rank 0 reads the checkpoints
        checkpointer.choose_checkpoint = failing_disk
    started = time.monotonic()
    try:
        ckpt = AdaptiveCheckpointer(root, model=torch.nn.Linear(2, 2), backend=DistributedBackend())
        if rank == 0 and where == "listing":  # ... or as it first lists the directory
            ckpt.storage.list = failing_disk
        if rank == 0 and where == "after":  # ... or as it logs the restore, before the due step
            ckpt.runlog.append = failing_disk
        result = f"restored {ckpt.restore()}"
    except OSError as exc:
        result = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    (Path(out) / f"rank{rank}.txt").write_text(f"{took:.1f} {result}")
    dist.destroy_process_group()


@pytest.mark.parametrize("where", ["choosing", "listing", "after"])
def test_a_disk_error_on_rank_zero_while_choosing_reaches_every_rank(tmp_path, where):
    # Rank 0 chooses alone: an OSError there used to leave rank 0 with its exception and the
    # other ranks waiting in the broadcast for it (gloo's timeout, 30 min by default). The
    # listing case is the first review's: rank 0 lists what earlier launches moved aside
    # before the first choice, outside its guard; "after" the second's: rank 0 logs the
    # restore alone before the due step is broadcast (here after finding nothing to restore).
    from simulator.controller import AdaptiveCheckpointer

    root = tmp_path / "ckpt"
    ckpt = AdaptiveCheckpointer(root, model=torch.nn.Linear(2, 2))
    if where != "after":
        ckpt.save(3)
    ckpt.close()
    doing = {
        "choosing": "while choosing a checkpoint in",
        "listing": "listing what earlier launches moved aside in",
        "after": "after restoring from",
    }[where]
    args = (free_port(), str(root), str(tmp_path), where)
    mp.start_processes(
        _restore_while_rank_zero_cannot_read, args=args, nprocs=WORLD, start_method="fork"
    )
    results = [(tmp_path / f"rank{r}.txt").read_text().split(" ", 1) for r in range(WORLD)]
    assert results[0][1] == "OSError: [Errno 5] Input/output error"
    for _took, result in results[1:]:
        assert result == (
            f"CheckpointReadError: rank 0 failed {doing} {root}: "
            "OSError: [Errno 5] Input/output error"
        )
    assert all(float(took) < 30 for took, _ in results)  # heard at once, not at a timeout
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == (
        [] if where == "after" else ["step-00000003"]
    )  # nothing was judged or moved aside


class _Position:
    """A per-rank object the checkpointer saves (``extra=``), as a data position is."""

    def __init__(self):
        self.at = 1

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


def _restore_while_one_rank_fails(rank: int, port: int, root: str, out: str, where: str) -> None:
    """Session 1 saves step 1 on two ranks; session 2 starts and restores it (and for some
    cases saves step 2) while ``where`` fails on one rank alone (rank 1, or rank 0 for rank 0's
    own work); each rank's time and outcome in ``out/rank<r>.txt`` (``timed_outcome``)."""
    import errno

    from simulator.ckptio import CheckpointWriteError
    from simulator.controller import AdaptiveCheckpointer, checkpointer, commit, runlog
    from simulator.controller import distributed as backend_module
    from simulator.controller.distributed import DistributedBackend
    from simulator.controller.integrity import CorruptCheckpoint

    def eio(*_args, **_kwargs):
        raise OSError(errno.EIO, "Input/output error")

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    _init(rank, port)
    position = _Position()

    now = [0.0]  # "committing": a step a second, so check points come every 5 steps

    def controller(model: torch.nn.Module) -> AdaptiveCheckpointer:
        config = {"shard": rank} if where == "config" else None  # a value per rank, by mistake
        return AdaptiveCheckpointer(
            root,
            model=model,
            backend=DistributedBackend(),
            extra={"position": position},
            config=config,
            **(
                {"async_save": True, "clock": lambda: now[0]}
                if where in ("committing", "writing")
                else {}
            ),
        )

    torch.manual_seed(1)
    first_model = torch.nn.Linear(64, 64)  # 16 KiB of weights: more than any gather may carry
    first = controller(first_model)
    first.restore()
    first.save(1)
    first.close(finished=False)
    saved = first_model.weight.detach().clone()
    torch.manual_seed(2)
    model = torch.nn.Linear(64, 64)
    weights = model.weight.data_ptr()
    if rank == 1 and where == "metadata":  # its read of the shared .metadata fails
        backend_module.load_metadata = eio
    if rank == 1 and where == "position":  # its data position does not load

        def refuse(_state):
            raise ValueError("the data position does not fit")

        position.load_state_dict = refuse
    if rank == 1 and where == "checking":  # its own values (RNG, data position) fail a check

        def malformed(_state, where):
            raise CorruptCheckpoint(f"{where}: malformed state")

        checkpointer.check_state = malformed

    gathered = [0]  # the largest object a rank sent in an all-gather, pickled
    all_gather_object = dist.all_gather_object

    def measured(*args, **kwargs):  # (object_list, obj, group=...), by name or not
        obj = kwargs["obj"] if "obj" in kwargs else args[1]
        gathered[0] = max(gathered[0], len(pickle.dumps(obj)))
        return all_gather_object(*args, **kwargs)

    dist.all_gather_object = measured

    def attempt() -> str:
        if rank == 0 and where == "starting":  # its run log as the session starts; a filter
            runlog.RunLog._append = full
        if where == "starting":
            warnings.filterwarnings("error", message="cannot write the run log")
        ckpt = controller(model)
        if where == "finished":  # rank 0 reads whether the run had finished; a filter: fatal
            if rank == 0:
                runlog.read_events = eio
            warnings.filterwarnings("error", message="cannot read the run log")
        if where == "moving" and rank == 0:  # as if its restore had left a rejected one in place
            ckpt._rejected_in_place.add("step-00000001")  # which no rank may call intact
        step = ckpt.restore()
        if where == "capturing":  # rank 1's data position cannot be read at the next save
            if rank == 1:

                def unreadable_position():
                    raise ValueError("the data position cannot be read")

                position.state_dict = unreadable_position
            ckpt.save(2)
        if where.startswith("interrupting"):  # Ctrl-C on rank 1 alone, as it captures its
            # state, or inside DCP's save of its shard

            def interrupted(*_args):
                raise KeyboardInterrupt

            if rank == 1 and where == "interrupting":
                position.state_dict = interrupted
            if rank == 1 and where == "interrupting a shard":
                os.fsync = interrupted
            ckpt.save(2)
        if where == "moving":  # rank 0 cannot move aside a rejected step-2 the save replaces
            if rank == 0:

                def kept(step):
                    raise CheckpointWriteError(f"step {step} cannot be moved aside")

                ckpt._keep_rejected = kept
            ckpt.save(2)
        if where in ("committing", "writing"):  # an async save fails in the background
            if where == "committing" and rank == 0:  # after every rank's write: its manifest
                commit.write_manifest = full
            if where == "writing" and rank == 1:  # its own shard, inside DCP's collective save
                os.fsync = full
            ckpt.save(2)
            if rank == 0:  # its write has failed before it trains on (rank 1 trains at once)
                ckpt._inflight.exception(timeout=20)
            for later in range(3, 200):  # rank 0 alone raised at the first, rank 1 went on
                now[0] += 1.0
                heard = Path(out) / f"step{rank}.txt"  # where every rank heard of it
                heard.write_text(str(later))
                ckpt.step(later)
        if where == "shard":  # rank 1's own shard of a save, inside DCP's collective save
            if rank == 1:
                os.fsync = full
            ckpt.save(2)
        if where == "logging":  # rank 0's run log fills its disk at a save; a filter: fatal
            if rank == 0:
                ckpt.runlog._append = full
            warnings.filterwarnings("error", message="cannot write the run log")
            ckpt.save(2)
        same = model.weight.data_ptr() == weights and torch.equal(model.weight.detach(), saved)
        return (
            f"restored {step}"
            + (" into the model's own tensors" if same else "")
            + (f", gathering {gathered[0]:,} bytes" if gathered[0] > 4096 else "")
        )

    timed_outcome(rank, WORLD, Path(out), attempt)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    ("where", "own", "others"),  # what rank 1 says, what rank 0 says
    [
        (
            "nowhere",
            "restored 1 into the model's own tensors",
            "restored 1 into the model's own tensors",
        ),
        (
            "metadata",
            "OSError: [Errno 5] Input/output error",
            "CheckpointReadError: rank 1 failed reading step-00000001: OSError: [Errno 5] "
            "Input/output error",
        ),
        (
            "checking",
            "CorruptCheckpoint: step-00000001: malformed state",
            "RuntimeError: rank 1 failed reading step-00000001: CorruptCheckpoint: step-00000001:"
            " malformed state",
        ),
        (
            "position",
            "IncompatibleCheckpoint: checkpoint {root}/step-00000001 does not fit this run",
            "IncompatibleCheckpoint: checkpoint {root}/step-00000001 does not fit this run",
        ),
        (
            "logging",  # rank 0 fails alone, after the save, before the due step is sent
            "RuntimeError: rank 0 failed logging the save of step 2: UserWarning: cannot write "
            "the run log",
            "UserWarning: cannot write the run log",
        ),
        (
            "starting",  # rank 0 alone, logging the session's start: a filter makes it fatal
            "RuntimeError: rank 0 failed reading the run log of {root}: UserWarning: cannot "
            "write the run log",
            "UserWarning: cannot write the run log",
        ),
        (
            "finished",  # rank 0 alone, reading whether the run had finished at the step
            "RuntimeError: rank 0 failed after restoring from {root}: UserWarning: cannot read "
            "the run log",
            "UserWarning: cannot read the run log",
        ),
        (
            "capturing",  # rank 1 alone, before the save's collective write
            "CheckpointWriteError: saving step 2 failed (the data position cannot be read); "
            "the previous checkpoint",
            "CheckpointWriteError: saving step 2 failed (rank 1 failed preparing the save of "
            "step 2: ValueError: the data position cannot be read); the previous checkpoint",
        ),
        (
            "interrupting",  # rank 1 alone, which keeps its interrupt; rank 0 is not left waiting
            "KeyboardInterrupt",
            "CheckpointWriteError: saving step 2 failed (rank 1 failed preparing the save of step "
            "2: KeyboardInterrupt); the previous checkpoint (step-00000001) is intact",
        ),
        (
            "interrupting a shard",  # inside DCP's save: DCP tells every rank
            "KeyboardInterrupt",
            "CheckpointWriteError: saving step 2 failed (DCP's save failed (rank 1: "
            "KeyboardInterrupt)); the previous checkpoint (step-00000001) is intact",
        ),
        (
            "moving",  # rank 0 alone, before the save's collective write
            "CheckpointWriteError: saving step 2 failed (rank 0 failed preparing the save of "
            "step 2: CheckpointWriteError: step 2 cannot be moved aside); the previous checkpoint "
            "(none yet) is intact",
            "CheckpointWriteError: saving step 2 failed (step 2 cannot be moved aside); the "
            "previous checkpoint (none yet) is intact",
        ),
        (
            "committing",  # rank 0 alone, its async save's commit, heard at the next save
            "CheckpointWriteError: rank 0 failed finishing the last background write: "
            "CheckpointWriteError: background write of step 2 failed ([Errno 28] No space left "
            "on device); the previous checkpoint (step-00000001) is intact",
            "CheckpointWriteError: background write of step 2 failed ([Errno 28] No space left on "
            "device); the previous checkpoint (step-00000001) is intact",
        ),
        (
            "shard",  # rank 1 alone, its own shard of a save, inside DCP's collective
            "CheckpointWriteError: saving step 2 failed (DCP's save failed (rank 1: OSError: "
            "[Errno 28] No space left on device)); the previous checkpoint (step-00000001) is "
            "intact",
            "CheckpointWriteError: saving step 2 failed (DCP's save failed (rank 1: OSError: "
            "[Errno 28] No space left on device)); the previous checkpoint (step-00000001) is "
            "intact",
        ),
        (
            "writing",  # rank 1 alone, its own shard of an async save, inside DCP's collective
            "CheckpointWriteError: background write of step 2 failed (DCP's save failed (rank 1: "
            "OSError: [Errno 28] No space left on device)); the previous checkpoint "
            "(step-00000001) is intact",
            "CheckpointWriteError: background write of step 2 failed (DCP's save failed (rank 1: "
            "OSError: [Errno 28] No space left on device)); the previous checkpoint "
            "(step-00000001) is intact",
        ),
        pytest.param(
            "config",
            "IncompatibleCheckpoint: refusing to resume",
            "IncompatibleCheckpoint: refusing to resume",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_failure_on_one_rank_alone_reaches_every_rank_at_once(tmp_path, where, own, others):
    # Rank 1 alone failed before DCP's collective load (the other rank waited in it and then
    # called the checkpoint corrupt) or while loading its own objects or checking its
    # configuration after it (the other rank waited in the next broadcast): both until the
    # process group's timeout, 30 minutes by default.
    root = tmp_path / "ckpt"
    args = (free_port(), str(root), str(tmp_path), where)
    mp.start_processes(_restore_while_one_rank_fails, args=args, nprocs=WORLD, start_method="fork")
    said = {r: (tmp_path / f"rank{r}.txt").read_text().split(" ", 1) for r in range(WORLD)}
    assert said[1][1].startswith(own.format(root=root))
    assert said[0][1].startswith(others.format(root=root))
    if where == "nowhere":  # in place, and no rank's state sent to the others
        assert said[0][1] == said[1][1] == own
    if said[0][1].startswith("IncompatibleCheckpoint"):  # rank 1's refusal, saying so
        assert said[0][1] == said[1][1] + " (on rank 1)"
    assert all(float(took) < 30 for took, _ in said.values())  # at once, not at a timeout
    if where in ("committing", "writing"):  # every rank at the first check point after the
        # save (its step + probe_steps, 20): not one rank alone at step 3, nor at the next save
        heard = {r: int((tmp_path / f"step{r}.txt").read_text()) for r in range(WORLD)}
        assert heard == {0: 2 + 20, 1: 2 + 20}
