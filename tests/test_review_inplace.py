"""Review of the in-place restore (a058816): where reading a checkpoint straight into the live
state's tensors writes memory it should not, or gives another result than a fresh read.

Each test drives the public API (AdaptiveCheckpointer save/restore) the way the README shows."""

import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, NoIntactCheckpoint
from simulator.controller.storage import checkpoint_name
from simulator.policies import FixedInterval


def _ckpt(directory, model, opt, **kw):
    return AdaptiveCheckpointer(
        directory, model=model, optimizer=opt, policy=FixedInterval(1e9), **kw
    )


def _damage(directory, step, start=0.25):
    """Flip bytes from ``start`` of a checkpoint's tensor file on: the in-place read has
    written most of them before the CRC-32 says no."""
    file = directory / checkpoint_name(step) / ckptio.TENSOR_FILE
    data = bytearray(file.read_bytes())
    for i in range(int(len(data) * start), len(data) - 8, 97):
        data[i] ^= 0x5A
    file.write_bytes(bytes(data))


# -- 1. extra plain values are replaced by a restore, yet it writes into them -----------------
def _data(seed=0):
    torch.manual_seed(seed)
    return torch.randn(100, 8), torch.randn(100, 1)


def test_a_restore_leaves_the_dataset_a_prefetched_batch_was_sliced_from_untouched(tmp_path):
    # The README's prefetched batch, taken as a slice of in-memory data (X[i:i+B] is a view).
    X, y = _data()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _ckpt(tmp_path, model, opt, extra={"batch": (X[:10], y[:10])}) as ck:
        ck.restore()
        ck.extra["batch"] = (X[30:40], y[30:40])  # the batch in hand at the save
        ck.save(1)
    # The relaunch builds its first batch the same way, then restores.
    X, y = _data()
    kept = X.clone(), y.clone()
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _ckpt(tmp_path, model, opt, extra={"batch": (X[:10], y[:10])}) as ck:
        assert ck.restore() == 1
        xb, yb = ck.extra["batch"]
    assert torch.equal(xb, kept[0][30:40]) and torch.equal(yb, kept[1][30:40])
    # The restore replaces extra["batch"]; it must not write the saved batch into the data set
    # (rows 0-9 overwritten by rows 30-39: the epoch then trains on duplicated data).
    assert torch.equal(X, kept[0]), "the restore wrote into the training data"
    assert torch.equal(y, kept[1]), "the restore wrote into the training data"


# -- 2. memory shared with a file or another process gets a corrupt checkpoint's bytes --------
class _WithMappedTable(torch.nn.Module):
    """A frozen table mapped shared from a file (torch.from_file(shared=True)): saved as a
    buffer, shared with every process that maps the file."""

    def __init__(self, file):
        super().__init__()
        table = torch.from_file(str(file), shared=True, size=64 * 1000).view(1000, 64)
        self.register_buffer("table", table)
        self.head = torch.nn.Linear(64, 1)


def test_a_failed_restore_writes_nothing_into_a_buffer_mapped_shared_from_a_file(tmp_path):
    table_file = tmp_path / "table.bin"
    torch.manual_seed(0)
    torch.randn(1000, 64).numpy().tofile(table_file)
    original = table_file.read_bytes()
    model = _WithMappedTable(table_file)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with _ckpt(tmp_path / "ck", model, opt) as ck:
        ck.restore()
        ck.save(1)
    del model, opt
    _damage(tmp_path / "ck", 1)
    model = _WithMappedTable(table_file)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NoIntactCheckpoint), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _ckpt(tmp_path / "ck", model, opt) as ck:
            ck.restore()
    # The launch ends, as the design says; but the corrupt bytes went through to the file,
    # which outlives it (and to every process sharing the mapping meanwhile).
    changed = sum(a != b for a, b in zip(original, table_file.read_bytes(), strict=True))
    assert changed == 0, f"a refused restore changed {changed} bytes of {table_file.name}"


# -- 3. the tree, not the tensor's name, says where a tensor goes ----------------------------
def _two_layers(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_checkpoint_whose_tree_places_tensors_apart_from_their_names_loads_as_a_fresh_read(
    tmp_path,
):
    model, opt = _two_layers(0)
    with _ckpt(tmp_path, model, opt) as ck:
        ck.restore()
        ck.save(1)
    where = tmp_path / checkpoint_name(1)
    tensors, tree = ckptio.read_checkpoint(where)
    # Another writer (a conversion script, another ckptsim) names the file's tensors apart from
    # flatten's scheme: here layer 0's tensor is stored as "model/1.weight" and the other way
    # round. The CRC-32s are right; the tree says which tensor goes where.
    model_tree = tree["model"]
    model_tree["0.weight"], model_tree["1.weight"] = model_tree["1.weight"], model_tree["0.weight"]
    shutil.rmtree(where)
    ckptio.write_checkpoint(where, tensors, tree)
    results = {}
    for fresh in (True, False):  # allow_fresh_start reads into fresh memory
        model, opt = _two_layers(5)
        with _ckpt(tmp_path, model, opt, allow_fresh_start=fresh) as ck:
            assert ck.restore() == 1
        results[fresh] = [model[0].weight.detach().clone(), model[1].weight.detach().clone()]
    assert torch.equal(results[True][0], tensors["model/1.weight"])
    assert torch.equal(results[True][1], tensors["model/0.weight"])
    # In place, loading layer 0 overwrites the live tensor that is layer 1's source: both
    # layers end with the same values and the checkpoint's "model/0.weight" is lost.
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True], strict=True))


# -- 4. a destination the read cannot write is blamed on the checkpoint ----------------------
_READ_ONLY_TABLE = r"""
import mmap, sys, warnings
from pathlib import Path
import torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval

directory, table_file = Path(sys.argv[1]), Path(sys.argv[2])
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        with open(table_file, "rb") as f:
            view = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)  # a read-only mapping
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the buffer is not writable
            self.register_buffer("table", torch.frombuffer(view, dtype=torch.float32))
        self.head = torch.nn.Linear(4, 1)
model = M()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with AdaptiveCheckpointer(directory, model=model, optimizer=opt, policy=FixedInterval(1e9)) as ck:
    step = ck.restore()
    if step == 0:
        ck.save(1)
        ck.save(2)
"""


def test_a_live_tensor_the_read_cannot_write_never_gets_intact_checkpoints_moved_aside(tmp_path):
    # A frozen table mapped read-only (weights shared from a file). Writing into it is this
    # run's problem, not the checkpoints': whatever the restore does (refuse, read fresh,
    # even crash as load_state_dict's copy does), intact checkpoints stay where they are.
    script, table_file = tmp_path / "run.py", tmp_path / "table.bin"
    script.write_text(_READ_ONLY_TABLE)
    torch.arange(4096.0).numpy().tofile(table_file)
    directory = tmp_path / "ck"
    launch = [sys.executable, str(script), str(directory), str(table_file)]
    subprocess.run(launch, check=True, capture_output=True, timeout=120)
    assert {p.name for p in directory.glob("step-*")} == {checkpoint_name(1), checkpoint_name(2)}
    subprocess.run(launch, capture_output=True, timeout=120)  # the relaunch restores
    left = sorted(p.name for p in directory.glob("step-*"))
    assert left == [checkpoint_name(1), checkpoint_name(2)], f"moved aside: {left}"


# -- what held up ------------------------------------------------------------------------------
def _tied(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False), torch.nn.Linear(10, 10)
    )
    model[1].weight = model[0].weight
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def _step(model, opt, frozen_last=False):
    model[2].requires_grad_(not frozen_last)
    opt.zero_grad()
    model(torch.tensor([1, 2, 3])).pow(2).sum().backward()
    opt.step()


def test_a_fully_read_misnamed_and_two_corrupt_candidates_fall_back_to_an_exact_older_one(
    tmp_path,
):
    # Tied weights; the older checkpoint has no optimizer state for the last layer (frozen
    # then); the newest is an intact copy under a newer name (read in full, in place, then
    # rejected as misnamed), the next two are corrupt (read in part).
    model, opt = _tied(0)
    with _ckpt(tmp_path, model, opt, keep_last=5) as ck:
        ck.restore()
        _step(model, opt, frozen_last=True)
        ck.save(1)
        want_model = {k: v.clone() for k, v in model.state_dict().items()}
        want_opt = [{n: t.clone() for n, t in s.items()} for s in opt.state.values()]
        for step in (2, 3):
            _step(model, opt)
            ck.save(step)
    shutil.copytree(tmp_path / checkpoint_name(3), tmp_path / checkpoint_name(4))
    for step in (2, 3):
        _damage(tmp_path, step, start=0.5)
    model, opt = _tied(7)
    for _ in range(2):
        _step(model, opt)  # other values everywhere, every param with moments
    with pytest.warns(UserWarning), _ckpt(tmp_path, model, opt) as ck:
        assert ck.restore() == 1
    assert model[0].weight.data_ptr() == model[1].weight.data_ptr()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want_model.items())
    got = list(opt.state.values())
    assert len(got) == len(want_opt) == 1  # the last layer's moments are gone, as at step 1
    assert all(torch.equal(got[0][n], t) for n, t in want_opt[0].items())
