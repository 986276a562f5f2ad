"""optimizer_precision / weights_precision: moments in bf16 or blockwise int8, weights in bf16.

The default stays bit-exact and writes the same checkpoint as before; bf16 and int8 shrink the
optimizer part ~2x and ~3.9x, round-trip within stated relative errors, keep ``exp_avg_sq``
non-negative and finite, record themselves in meta.json, warn once at restore, and a run
resumed from an int8 checkpoint trains on within 1 % of the exact resume's loss. Weights in
bf16 are fp32 weights rounded to nearest, tied weights stored once, and a bf16 model stays
bit-exact. Which tensors qualify costs one synchronisation, not one per tensor; an async save
encodes in its writer thread and writes what a synchronous one does. Tampered reduced entries
are corrupt (the run falls back), never NaN or a raw exception.
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from simulator import ckptio
from simulator.ckptio import CorruptCheckpoint, verify_checkpoint
from simulator.controller import AdaptiveCheckpointer, LocalBackend
from simulator.controller import checkpointer as checkpointer_module
from simulator.controller.precision import BLOCK, MIN_NUMEL, expand_state, reduce_state
from simulator.controller.storage import checkpoint_name
from simulator.errors import InputError
from simulator.policies import FixedInterval

# Relative errors ||restored - saved|| / ||saved|| of each reduced moment tensor. Measured on
# this model (torch 2.x, CPU): bf16 ~1.7e-3 for both; int8 ~7e-3 (exp_avg), ~3.5e-3
# (exp_avg_sq), ~2e-3 on sqrt(exp_avg_sq), the denominator Adam uses.
TOLERANCE = {
    "bf16": {"exp_avg": 4e-3, "exp_avg_sq": 4e-3},
    "int8": {"exp_avg": 1.5e-2, "exp_avg_sq": 1e-2, "sqrt(exp_avg_sq)": 5e-3},
}


def make_run(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.Tanh(), torch.nn.Linear(128, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 1),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return model, opt


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same regression batch for a step in every run."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, 32, generator=g)
    return x, torch.sin(x[:, :4].sum(dim=1, keepdim=True))


def train(model, opt, steps: range) -> list[float]:
    losses = []
    for step in steps:
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def checkpointer(root, model, opt, **kw):
    return AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9), **kw)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One trained run saved at step 30 in each precision; the optimizer state as it was."""
    model, opt = make_run()
    train(model, opt, range(30))
    roots = {}
    for precision in ("fp32", "bf16", "int8"):
        roots[precision] = tmp_path_factory.mktemp(precision) / "run"
        ck = checkpointer(roots[precision], model, opt, optimizer_precision=precision)
        ck.save(30)
        ck.close(finished=False)
    expect = {
        "param_groups": copy.deepcopy(opt.state_dict()["param_groups"]),
        "moments": [{n: t.clone() for n, t in opt.state[p].items()} for p in model.parameters()],
        "model": {k: v.clone() for k, v in model.state_dict().items()},
    }
    return roots, expect


def restored(root: Path, **kw):
    model, opt = make_run(seed=99)
    ck = checkpointer(root, model, opt, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = ck.restore()
    ck.close(finished=False)
    assert step == 30
    return model, opt, [str(w.message) for w in caught]


def optimizer_bytes(root: Path) -> int:
    tensors = load_file(root / checkpoint_name(30) / ckptio.TENSOR_FILE)
    return sum(t.numel() * t.element_size() for k, t in tensors.items() if k.startswith("optim"))


def test_the_default_writes_no_record_and_resumes_bit_exactly_without_a_warning(saved):
    roots, expect = saved
    meta = json.loads((roots["fp32"] / checkpoint_name(30) / ckptio.META_FILE).read_text())
    assert "precision" not in meta
    model, opt, messages = restored(roots["fp32"])
    assert not [m for m in messages if "bit-exact" in m]
    for p, want in zip(model.parameters(), expect["moments"], strict=True):
        assert all(torch.equal(opt.state[p][n], t) for n, t in want.items())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expect["model"].items())


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_moments_round_trip_within_tolerance_and_the_rest_stays_exact(saved, precision):
    roots, expect = saved
    ck = roots[precision] / checkpoint_name(30)
    verify_checkpoint(ck)
    assert sorted(p.name for p in ck.iterdir()) == sorted(
        [ckptio.TENSOR_FILE, ckptio.META_FILE, ckptio.MANIFEST]
    )  # safetensors and JSON only: no pickle anywhere
    meta = json.loads((ck / ckptio.META_FILE).read_text())
    assert meta["precision"] == {
        "optimizer": precision,
        "weights": "fp32",
        "block": BLOCK,
        "min_numel": MIN_NUMEL,
    }
    # This run's own option does not matter: the checkpoint's record does.
    model, opt, messages = restored(roots[precision], optimizer_precision="fp32")
    how = "bf16" if precision == "bf16" else f"int8 (blockwise, {BLOCK})"
    lost = [m for m in messages if "bit-exact" in m]
    assert lost == [f"optimizer moments restored from {how}: not bit-exact ({ck.name})"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expect["model"].items())
    assert opt.state_dict()["param_groups"] == expect["param_groups"]
    reduced = 0
    for p, want in zip(model.parameters(), expect["moments"], strict=True):
        got = opt.state[p]
        assert torch.equal(got["step"], want["step"])  # step counters exact
        for name in ("exp_avg", "exp_avg_sq"):
            a, b = want[name], got[name]
            assert b.dtype == a.dtype and b.shape == a.shape and torch.isfinite(b).all()
            if a.numel() < MIN_NUMEL:
                assert torch.equal(a, b), f"{name} of {a.numel()} values must stay exact"
                continue
            reduced += 1
            rel = ((b - a).norm() / a.norm()).item()
            assert 0 < rel < TOLERANCE[precision][name], (name, rel)
        assert (got["exp_avg_sq"] >= 0).all()
        if precision == "int8" and p.numel() >= MIN_NUMEL:
            a, b = want["exp_avg_sq"].sqrt(), got["exp_avg_sq"].sqrt()
            rel = ((b - a).norm() / a.norm()).item()
            assert rel < TOLERANCE["int8"]["sqrt(exp_avg_sq)"], rel
            # A positive second moment never comes back as 0 (its update would be m / eps).
            assert ((want["exp_avg_sq"] > 0) <= (got["exp_avg_sq"] > 0)).all()
    assert reduced == 4  # two weight matrices' moments; the biases and the 32x1 are too small


def test_the_optimizer_part_is_at_least_1_9x_and_3x_smaller(saved):
    roots, _ = saved
    fp32, bf16, int8 = (optimizer_bytes(roots[p]) for p in ("fp32", "bf16", "int8"))
    assert fp32 / bf16 >= 1.9, fp32 / bf16
    assert fp32 / int8 >= 3.0, fp32 / int8


def test_a_run_resumed_from_int8_trains_on_within_1_percent_of_the_exact_resume(saved):
    roots, _ = saved
    finals = {}
    for precision in ("fp32", "int8"):
        model, opt, _ = restored(roots[precision])
        losses = train(model, opt, range(30, 230))
        finals[precision] = sum(losses[-20:]) / 20
    rel = abs(finals["int8"] - finals["fp32"]) / finals["fp32"]
    assert rel < 0.01, finals


@pytest.mark.parametrize("bad", ["fp16", "INT8", "", 8, None, ("int8",)])
def test_a_bad_precision_is_one_clear_input_error(tmp_path, bad):
    model, opt = make_run()
    with pytest.raises(InputError, match="optimizer_precision must be one of 'fp32', 'bf16', "):
        checkpointer(tmp_path / "run", model, opt, optimizer_precision=bad)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_only_large_finite_float_tensors_are_reduced_and_the_live_state_is_untouched():
    big = torch.rand(MIN_NUMEL) + 0.5
    state = {
        "optimizer": {
            "state": {
                0: {"step": torch.tensor(3.0), "exp_avg_sq": big, "momentum": -big},
                1: {"exp_avg": torch.randn(MIN_NUMEL - 1)},  # too small
                2: {"exp_avg": torch.full((MIN_NUMEL,), float("inf"))},  # not finite: exact
                3: {"count": torch.arange(MIN_NUMEL)},  # not a float
            },
            "param_groups": [{"lr": 1.0, "params": [0, 1, 2, 3]}],
        },
        "model": {"w": torch.randn(MIN_NUMEL)},
    }
    live = state["optimizer"]["state"]
    out = reduce_state(state, "int8")
    assert out["model"] is state["model"] and live[0]["exp_avg_sq"] is big
    reduced = out["optimizer"]["state"]
    assert reduced[0]["step"] is live[0]["step"]
    assert reduced[0]["exp_avg_sq"]["sqrt"] is True and reduced[0]["momentum"]["sqrt"] is False
    assert reduced[0]["exp_avg_sq"]["int8"].dtype == torch.uint8
    assert reduced[0]["momentum"]["int8"].dtype == torch.int8
    assert all(reduced[i] == live[i] for i in (1, 2, 3))
    back, lost = expand_state(out)
    assert "precision" not in back and lost is not None
    assert torch.isfinite(back["optimizer"]["state"][0]["exp_avg_sq"]).all()
    assert reduce_state(state, "fp32") is state


# -- tampered reduced entries are corrupt: the run falls back to the older checkpoint ---------
def _reseal(ck: Path) -> None:
    manifest = json.loads((ck / ckptio.MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        data = (ck / name).read_bytes()
        entry.update(bytes=len(data), crc32=zlib.crc32(data))
    manifest["bytes"] = sum(e["bytes"] for e in manifest["files"].values())
    (ck / ckptio.MANIFEST).write_text(json.dumps(manifest))


def _edit_meta(change):
    def edit(ck: Path) -> None:
        meta = json.loads((ck / ckptio.META_FILE).read_text())
        change(meta)
        (ck / ckptio.META_FILE).write_text(json.dumps(meta))
        _reseal(ck)

    return edit


def _edit_tensor(name, change):
    def edit(ck: Path) -> None:
        tensors = load_file(ck / ckptio.TENSOR_FILE)
        tensors[name] = change(tensors[name])
        save_file(tensors, ck / ckptio.TENSOR_FILE, metadata={"format": "pt"})
        _reseal(ck)

    return edit


def _first_entry(meta):
    """The first reduced entry in meta.json (param 0's exp_avg_sq, on the sqrt scale)."""
    pairs = meta["optimizer"]["state"]["__dict__"]
    return pairs[0][1]["exp_avg_sq"]


SQ = "optimizer/state/0/exp_avg_sq"
TAMPERING = {
    "a record of an unknown precision": (
        _edit_meta(lambda m: m["precision"].update(optimizer="int4")),
        "precision of the optimizer is 'int4'",
    ),
    "a record with a block size of 0": (
        _edit_meta(lambda m: m["precision"].update(block=0)),
        "precision block is 0",
    ),
    "a dtype that is no float": (
        _edit_meta(lambda m: _first_entry(m).update(dtype="int64")),
        "dtype 'int64' is not a float dtype",
    ),
    "a shape the codes do not fit": (
        _edit_meta(lambda m: _first_entry(m).update(shape=[7, 7])),
        r"codes are torch.uint8 \(4096,\), not 49",
    ),
    "signed codes claimed as sqrt-scale": (
        _edit_meta(lambda m: _first_entry(m).update(sqrt=False)),
        "not 4096 torch.int8 values",
    ),
    "an extra key in an entry": (
        _edit_meta(lambda m: _first_entry(m).update(more=1)),
        "a reduced tensor has keys",
    ),
    "a NaN scale": (
        _edit_tensor(f"{SQ}/scale", lambda t: t.index_fill(0, torch.tensor([0]), float("nan"))),
        "a scale is negative or not finite",
    ),
    "a negative scale": (
        _edit_tensor(f"{SQ}/scale", lambda t: -t),
        "a scale is negative or not finite",
    ),
    "a scale whose square overflows": (
        _edit_tensor(f"{SQ}/scale", lambda t: torch.full_like(t, 3e38)),
        "decodes to values that are not finite",
    ),
    "codes of another dtype": (
        _edit_tensor(f"{SQ}/int8", lambda t: t.to(torch.int16)),
        r"codes are torch.int16",
    ),
    "a record that calls reduced moments exact": (
        _edit_meta(lambda m: m["precision"].update(optimizer="fp32")),
        "optimizer state 0/'exp_avg': a reduced tensor where the precision record says 'fp32'",
    ),
    "a record that calls reduced weights exact": (
        _edit_meta(lambda m: m["precision"].update(weights="fp32")),
        "model '0.weight': a reduced tensor where the precision record says 'fp32'",
    ),
    "a weights record of an unknown precision": (
        _edit_meta(lambda m: m["precision"].update(weights="int8")),
        "precision of the weights is 'int8'",
    ),
    "a record that reduces nothing": (
        _edit_meta(lambda m: m["precision"].update(optimizer="fp32", weights="fp32")),
        "a precision record that reduces nothing",
    ),
    "a record with an unknown key": (
        _edit_meta(lambda m: m["precision"].update(activations="fp8")),
        "not a precision record",
    ),
    "a weight whose dtype is no float": (
        _edit_meta(lambda m: m["model"]["0.weight"].update(dtype="int32")),
        "model '0.weight': dtype 'int32' is not a float dtype",
    ),
    "a weight shape its data do not fit": (
        _edit_meta(lambda m: m["model"]["0.weight"].update(shape=[3, 3])),
        r"model '0.weight': bf16 data is torch.bfloat16 \(4096,\), not 9 bfloat16 values",
    ),
    "bf16 weight data of another dtype": (
        _edit_tensor("model/0.weight/bf16", lambda t: t.to(torch.float16)),
        r"bf16 data is torch.float16",
    ),
    "a weight that decodes to infinity": (
        _edit_tensor(
            "model/2.weight/bf16", lambda t: t.index_fill(0, torch.tensor([5]), float("inf"))
        ),
        "model '2.weight': decodes to values that are not finite",
    ),
}


@pytest.fixture
def two_int8_saves(tmp_path):
    """Two saves with int8 moments and bf16 weights; the attacks go to the newer one."""
    model, opt = make_run()
    with checkpointer(
        tmp_path / "run", model, opt, optimizer_precision="int8", weights_precision="bf16"
    ) as c:
        for step in (1, 2):
            train(model, opt, range(step - 1, step))
            c.save(step)
    return tmp_path / "run"


@pytest.mark.parametrize("attack", list(TAMPERING))
def test_a_tampered_reduced_checkpoint_is_corrupt_and_the_run_falls_back(two_int8_saves, attack):
    root = two_int8_saves
    tamper, reason = TAMPERING[attack]
    ck = root / checkpoint_name(2)
    tamper(ck)
    verify_checkpoint(ck)  # every byte matches the resealed manifest
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        expand_state(LocalBackend().read(ck, {}), where=ck.name)
    assert "\n" not in str(info.value) and ck.name in str(info.value)
    model, opt = make_run(seed=7)
    c = checkpointer(root, model, opt)
    with pytest.warns(UserWarning, match=reason):
        assert c.restore() == 1
    c.close(finished=False)
    assert all(torch.isfinite(s["exp_avg_sq"]).all() for s in opt.state.values())


def test_an_async_int8_save_writes_what_a_synchronous_one_does(tmp_path):
    model, opt = make_run()
    train(model, opt, range(3))
    for mode in ("sync", "async"):
        ck = checkpointer(
            tmp_path / mode, model, opt, optimizer_precision="int8", async_save=mode == "async"
        )
        ck.save(3)
        ck.close(finished=False)
    a, b = (
        load_file(tmp_path / m / checkpoint_name(3) / ckptio.TENSOR_FILE) for m in ("sync", "async")
    )
    assert sorted(a) == sorted(b) and any(k.endswith("/scale") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("rng"))


class _SealingBackend(LocalBackend):
    def writes_manifest(self) -> bool:
        return True


def test_a_reduced_precision_with_a_distributed_backend_is_refused(tmp_path):
    model, opt = make_run()
    with pytest.raises(InputError, match="optimizer_precision='bf16' is for the local backend"):
        checkpointer(tmp_path, model, opt, optimizer_precision="bf16", backend=_SealingBackend())


def test_a_reduced_weights_precision_with_a_distributed_backend_is_refused(tmp_path):
    model, opt = make_run()
    with pytest.raises(InputError, match="weights_precision='bf16' is for the local backend"):
        checkpointer(tmp_path, model, opt, weights_precision="bf16", backend=_SealingBackend())


@pytest.mark.parametrize("bad", ["int8", "fp16", "BF16", None])
def test_a_bad_weights_precision_is_one_clear_input_error(tmp_path, bad):
    model, opt = make_run()
    with pytest.raises(InputError, match="weights_precision must be one of 'fp32', 'bf16', got"):
        checkpointer(tmp_path / "run", model, opt, weights_precision=bad)
    assert not (tmp_path / "run").exists()


# -- weights in bf16 ----------------------------------------------------------------------------
def _save_and_restore(root, model, opt, fresh, **kw):
    """Save ``model``/``opt`` at step 30 with ``kw``; restore into ``fresh()``'s objects."""
    with checkpointer(root, model, opt, **kw) as c:
        c.save(30)
    model2, opt2 = fresh()
    c = checkpointer(root, model2, opt2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert c.restore() == 30
    c.close(finished=False)
    meta = json.loads((root / checkpoint_name(30) / ckptio.META_FILE).read_text())
    tensors = load_file(root / checkpoint_name(30) / ckptio.TENSOR_FILE)
    return model2, opt2, [str(w.message) for w in caught], meta, tensors


def test_weights_in_bf16_are_the_fp32_weights_rounded_and_the_rest_stays_exact(tmp_path):
    model, opt = make_run()
    train(model, opt, range(30))
    live = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [{n: t.clone() for n, t in opt.state[p].items()} for p in model.parameters()]
    got, opt2, messages, meta, tensors = _save_and_restore(
        tmp_path / "run", model, opt, lambda: make_run(seed=5), weights_precision="bf16"
    )
    assert meta["precision"] == {
        "optimizer": "fp32",
        "weights": "bf16",
        "block": BLOCK,
        "min_numel": MIN_NUMEL,
    }
    assert [m for m in messages if "bit-exact" in m] == [
        f"model weights restored from bf16: not bit-exact ({checkpoint_name(30)})"
    ]
    rounded = 0
    for key, want in live.items():
        back = got.state_dict()[key]
        assert back.dtype == torch.float32
        if want.numel() >= MIN_NUMEL:
            rounded += 1
            assert tensors[f"model/{key}/bf16"].dtype == torch.bfloat16
            assert torch.equal(back, want.to(torch.bfloat16).float())  # round to nearest
            assert not torch.equal(back, want)
        else:
            assert torch.equal(back, want), key
    assert rounded == 2
    # Four bytes a weight value become two.
    model_bytes = sum(t.nbytes for k, t in tensors.items() if k.startswith("model/"))
    assert model_bytes == sum(2 * t.numel() if t.numel() >= MIN_NUMEL else t.nbytes
                              for t in live.values())  # fmt: skip
    for p, want in zip(got.parameters(), moments, strict=True):
        assert all(torch.equal(opt2.state[p][n], t) for n, t in want.items())


def test_weights_in_bf16_with_int8_moments_say_both_and_train_on_within_1_percent(saved, tmp_path):
    roots, _ = saved
    model, opt, _ = restored(roots["fp32"])  # the step-30 run, bit-exact
    fresh = lambda: make_run(seed=5)  # noqa: E731
    both, opt2, messages, meta, _ = _save_and_restore(
        tmp_path / "run", model, opt, fresh, weights_precision="bf16", optimizer_precision="int8"
    )
    assert (meta["precision"]["optimizer"], meta["precision"]["weights"]) == ("int8", "bf16")
    assert [m for m in messages if "bit-exact" in m] == [
        f"optimizer moments restored from int8 (blockwise, {BLOCK}) and model weights restored "
        f"from bf16: not bit-exact ({checkpoint_name(30)})"
    ]
    exact = train(model, opt, range(30, 230))
    reduced = train(both, opt2, range(30, 230))
    assert exact != reduced
    rel = abs(sum(reduced[-20:]) / sum(exact[-20:]) - 1)
    assert rel < 0.01, rel


def test_a_bf16_model_with_weights_bf16_resumes_bit_exactly_and_records_nothing(tmp_path):
    """bf16 weights stored as bf16 are the weights: nothing to lose, nothing to warn about."""

    def bf16_run(seed=0):
        model, _ = make_run(seed)
        model = model.to(torch.bfloat16)
        return model, torch.optim.AdamW(model.parameters(), lr=3e-3)

    model, opt = bf16_run()
    for step in range(5):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x.bfloat16()), y.bfloat16())
        opt.zero_grad()
        loss.backward()
        opt.step()
    live = {k: v.clone() for k, v in model.state_dict().items()}
    got, _, messages, meta, tensors = _save_and_restore(
        tmp_path / "run", model, opt, lambda: bf16_run(seed=5), weights_precision="bf16"
    )
    assert "precision" not in meta and not [m for m in messages if "bit-exact" in m]
    assert all(torch.equal(got.state_dict()[k], v) for k, v in live.items())
    assert tensors["model/0.weight"].dtype == torch.bfloat16


def test_tied_weights_are_stored_once_in_bf16(tmp_path):
    def tied_run(seed=0):
        torch.manual_seed(seed)
        emb = torch.nn.Embedding(64, 32)
        head = torch.nn.Linear(32, 64, bias=False)
        head.weight = emb.weight
        model = torch.nn.Sequential(emb, head)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    model, opt = tied_run()
    loss = model(torch.arange(16)).logsumexp(dim=1).mean()
    loss.backward()
    opt.step()
    want = model[0].weight.detach().to(torch.bfloat16).float()
    got, _, _, _, tensors = _save_and_restore(
        tmp_path / "run", model, opt, lambda: tied_run(seed=3), weights_precision="bf16"
    )
    stored = [k for k in tensors if k.startswith("model/")]
    assert stored == ["model/0.weight/bf16"], stored  # the head aliases it
    assert got[0].weight is got[1].weight and torch.equal(got[1].weight.detach(), want)


def test_values_the_encoding_could_overflow_are_kept_exact():
    """Finite values that would decode to infinity (a checkpoint that writes but never
    restores) are kept as they are: a float64 beyond float32, bfloat16's rounding of the
    largest float32 values, the square of int8's square-root scale."""
    huge = torch.full((MIN_NUMEL,), 1e300, dtype=torch.float64)
    near_max = torch.full((MIN_NUMEL,), 3.4e38)
    assert torch.isinf(near_max.to(torch.bfloat16)).all()
    state = {
        "model": {"w": near_max, "n": torch.full_like(near_max, float("nan")),
                  "h": torch.randn(MIN_NUMEL).half()},  # 2 bytes: bf16 would shrink nothing
        "optimizer": {"state": {0: {"exp_avg_sq": huge, "m": near_max, "v": near_max.abs()}},
                      "param_groups": []},
    }  # fmt: skip
    for how in ("bf16", "int8"):
        assert reduce_state(state, how, weights="bf16") is state, how


def test_which_tensors_qualify_is_one_synchronisation_not_one_per_tensor(monkeypatch):
    state = {
        "model": {f"w{i}": torch.randn(MIN_NUMEL) for i in range(8)},
        "optimizer": {
            "state": {i: {"exp_avg": torch.randn(MIN_NUMEL), "exp_avg_sq": torch.rand(MIN_NUMEL)}
                      for i in range(8)},
            "param_groups": [],
        },
    }  # fmt: skip
    state["model"]["bad"] = torch.full((MIN_NUMEL,), float("inf"))
    reads = []
    for name in ("__bool__", "__float__", "__int__", "item", "tolist"):
        method = getattr(torch.Tensor, name)

        def counted(self, *a, _method=method, _name=name, **kw):
            reads.append(_name)
            return _method(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    out = reduce_state(state, "int8", weights="bf16")
    monkeypatch.undo()
    assert reads == ["tolist"], reads  # one device-to-host read for the whole state
    assert out["model"]["bad"] is state["model"]["bad"]
    assert all(isinstance(out["model"][f"w{i}"], dict) for i in range(8))
    assert out["optimizer"]["state"][3]["exp_avg_sq"]["sqrt"] is True


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_async_save_encodes_in_its_writer_thread(tmp_path, monkeypatch, mode):
    threads = []
    original = checkpointer_module.reduce_state

    def spy(state, *a, **kw):
        threads.append(threading.current_thread().name)
        return original(state, *a, **kw)

    monkeypatch.setattr(checkpointer_module, "reduce_state", spy)
    model, opt = make_run()
    train(model, opt, range(2))
    with checkpointer(
        tmp_path / "run", model, opt, optimizer_precision="int8", async_save=mode == "async"
    ) as c:
        c.save(2)
    assert len(threads) == 1
    assert threads[0].startswith("ckpt-writer") == (mode == "async"), threads


def test_a_reduced_async_save_resumes_the_same_as_a_reduced_sync_save(tmp_path):
    model, opt = make_run()
    train(model, opt, range(30))
    runs = {}
    for mode in ("sync", "async"):
        got, opt2, messages, _, tensors = _save_and_restore(
            tmp_path / mode,
            model,
            opt,
            lambda: make_run(seed=5),
            optimizer_precision="int8",
            weights_precision="bf16",
            async_save=mode == "async",
        )
        assert any("model weights restored from bf16" in m for m in messages)
        runs[mode] = (tensors, train(got, opt2, range(30, 60)))
    (a, sync_losses), (b, async_losses) = runs["sync"], runs["async"]
    assert sorted(a) == sorted(b) and any(k.endswith("/bf16") for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a if not k.startswith("rng"))
    assert sync_losses == async_losses


def test_a_record_from_before_weights_precision_still_restores(saved, tmp_path):
    """Checkpoints written before ``weights`` joined the record hold exact weights."""
    roots, expect = saved
    root = tmp_path / "run"
    shutil.copytree(roots["int8"], root)
    ck = root / checkpoint_name(30)
    _edit_meta(lambda m: m["precision"].pop("weights"))(ck)
    model, _, messages = restored(root)
    assert [m for m in messages if "bit-exact" in m] == [
        f"optimizer moments restored from int8 (blockwise, {BLOCK}): not bit-exact ({ck.name})"
    ]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in expect["model"].items())
