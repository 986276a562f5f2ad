"""Checkpoints rewritten the way an attacker (or a careless script) would: every one refused.

Each attack starts from a real checkpoint that AdaptiveCheckpointer wrote, rewrites the
manifest and, where the attack needs it, the files (recomputing the CRC-32s, as anyone who can
write the files can). Then (a) ckptio or the state decoder refuses it with a CorruptCheckpoint
whose reason is one line, and (b) a run resuming from the directory falls back to the older,
good checkpoint, warning with that reason — never a raw exception, never a silent load.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from simulator import ckptio
from simulator.ckptio import CorruptCheckpoint, is_complete, read_checkpoint, verify_checkpoint
from simulator.controller import AdaptiveCheckpointer, IncompatibleCheckpoint, LocalBackend
from simulator.controller.integrity import write_manifest
from simulator.controller.state import check_state, restore_state
from simulator.controller.storage import checkpoint_name
from simulator.policies import FixedInterval

NEWEST = checkpoint_name(2)


# -- a real run with two good checkpoints -----------------------------------------------------
def make_run(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt):
    opt.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A run directory with good checkpoints at steps 1 and 2, and the model at step 1."""
    root = tmp_path_factory.mktemp("pristine") / "run"
    model, opt = make_run()
    with AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9)) as ck:
        train(model, opt)
        ck.save(1)
        at_step_1 = {k: v.clone() for k, v in model.state_dict().items()}
        train(model, opt)
        ck.save(2)
    return root, at_step_1


@pytest.fixture
def run(pristine, tmp_path):
    """A fresh copy of the pristine run (inside tmp_path/run) and the model at step 1."""
    root, at_step_1 = pristine
    copy = tmp_path / "run"
    shutil.copytree(root, copy, symlinks=True)
    return copy, at_step_1


def resumes_from_step_1(root: Path, at_step_1: dict, reason: str) -> None:
    """A new session on ``root`` warns with ``reason``, falls back and loads step 1 exactly."""
    model, opt = make_run(seed=99)
    ck = AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9))
    with pytest.warns(UserWarning, match=reason) as caught:
        step = ck.restore()
    ck.close()
    assert step == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in at_step_1.items())
    (warning,) = [w for w in caught if "falling back" in str(w.message)]
    assert "\n" not in str(warning.message)
    assert f"{NEWEST}: {NEWEST}:" not in str(warning.message)  # the name said once


def one_line(info: pytest.ExceptionInfo) -> str:
    message = str(info.value)
    assert message and "\n" not in message, message
    return message


# -- the attacker's tools ---------------------------------------------------------------------
def manifest_of(ck: Path) -> dict:
    return json.loads((ck / ckptio.MANIFEST).read_text())


def put_manifest(ck: Path, manifest) -> None:
    (ck / ckptio.MANIFEST).write_text(json.dumps(manifest))


def reseal(ck: Path, **changes) -> None:
    """Recompute the size and CRC-32 of every listed file that exists, as an attacker can."""
    manifest = manifest_of(ck)
    for name, entry in manifest["files"].items():
        file = ck / name
        if file.is_file():
            data = file.read_bytes()
            entry.update(bytes=len(data), crc32=zlib.crc32(data))
    manifest["bytes"] = sum(e["bytes"] for e in manifest["files"].values())
    manifest.update(changes)
    put_manifest(ck, manifest)


def flip_a_tensor_byte(ck: Path) -> None:
    file = ck / ckptio.TENSOR_FILE
    data = bytearray(file.read_bytes())
    data[-3] ^= 0xFF
    file.write_bytes(bytes(data))


def edit_meta(ck: Path, change) -> None:
    meta = json.loads((ck / ckptio.META_FILE).read_text())
    meta = change(meta)
    (ck / ckptio.META_FILE).write_text(meta if isinstance(meta, str) else json.dumps(meta))
    reseal(ck)


def edit_tensors(ck: Path, change) -> None:
    tensors = load_file(ck / ckptio.TENSOR_FILE)
    change(tensors)
    save_file(tensors, ck / ckptio.TENSOR_FILE, metadata={"format": "pt"})
    reseal(ck, tensors=len(tensors))


def edit_header(ck: Path, change) -> None:
    """Rewrite the safetensors header text in place (padded to its length: offsets hold)."""
    file = ck / ckptio.TENSOR_FILE
    data = file.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = change(data[8 : 8 + n].decode())
    assert len(header) <= n
    file.write_bytes(data[:8] + header.ljust(n).encode() + data[8 + n :])
    reseal(ck)


def set_header_length(ck: Path, length: int) -> None:
    file = ck / ckptio.TENSOR_FILE
    data = file.read_bytes()
    file.write_bytes(length.to_bytes(8, "little") + data[8:])
    reseal(ck)


def add_entry(ck: Path, name: str, data: bytes = b"x") -> None:
    manifest = manifest_of(ck)
    manifest["files"][name] = {"bytes": len(data), "crc32": zlib.crc32(data)}
    manifest["bytes"] = sum(e["bytes"] for e in manifest["files"].values())
    put_manifest(ck, manifest)


def set_entry(ck: Path, key: str, value, name: str = ckptio.TENSOR_FILE) -> None:
    manifest = manifest_of(ck)
    manifest["files"][name][key] = value
    put_manifest(ck, manifest)


def symlink_to_a_copy(ck: Path, name: str) -> None:
    """``name`` moved out of the checkpoint and linked back: same bytes, same CRC."""
    outside = ck.parent.parent / f"moved-{name}"
    (ck / name).rename(outside)
    (ck / name).symlink_to(outside)


def symlinked_directory(ck: Path) -> None:
    outside = ck.parent.parent / "elsewhere"
    ck.rename(outside)
    ck.symlink_to(outside, target_is_directory=True)


def outside_file(ck: Path) -> Path:
    """A real file two levels up (outside the run directory), as the attacker's target."""
    target = ck.parent.parent / "outside"
    target.write_bytes(b"secret bytes outside the checkpoint")
    return target


def list_outside(ck: Path, name: str) -> None:
    add_entry(ck, name, outside_file(ck).read_bytes())


# -- (a)+(b) for what only the manifest or the directory changes -----------------------------
STRUCTURE_ATTACKS = {
    "files emptied, then a tensor byte flipped": (
        lambda ck: (flip_a_tensor_byte(ck), reseal(ck, files={}, bytes=0)),
        "files is {}, not a non-empty object",
    ),
    "tensor file unlisted, then a byte flipped": (
        lambda ck: (
            flip_a_tensor_byte(ck),
            put_manifest(
                ck,
                {
                    **manifest_of(ck),
                    "files": {ckptio.META_FILE: manifest_of(ck)["files"][ckptio.META_FILE]},
                },
            ),
            reseal(ck),
        ),
        r"'tensors\.safetensors' is not listed in the manifest",
    ),
    "meta.json unlisted": (
        lambda ck: (
            put_manifest(
                ck,
                {
                    **manifest_of(ck),
                    "files": {ckptio.TENSOR_FILE: manifest_of(ck)["files"][ckptio.TENSOR_FILE]},
                },
            ),
            reseal(ck),
        ),
        r"'meta\.json' is not listed in the manifest",
    ),
    "an unlisted extra file": (
        lambda ck: (ck / "notes.txt").write_text("planted"),
        r"'notes\.txt' is not listed in the manifest",
    ),
    "an unlisted FIFO": (lambda ck: os.mkfifo(ck / "pipe"), "'pipe' is not a regular file"),
    "a listed FIFO": (
        lambda ck: (os.mkfifo(ck / "pipe"), add_entry(ck, "pipe", b"")),
        "'pipe' is not a regular file",
    ),
    "a name climbing out with ..": (
        lambda ck: list_outside(ck, "../../outside"),
        r"lists '\.\./\.\./outside', an empty, '\.' or '\.\.' path component",
    ),
    "an absolute name": (
        lambda ck: list_outside(ck, str(ck.parent.parent / "outside")),
        "an absolute path",
    ),
    "a name with NUL": (lambda ck: add_entry(ck, "meta.json\x00x"), "it contains NUL"),
    "a name with a backslash": (lambda ck: add_entry(ck, "..\\outside"), "a backslash"),
    "a name with a . component": (lambda ck: add_entry(ck, "./meta.json"), "'.' or '..'"),
    "a name with an empty component": (lambda ck: add_entry(ck, "sub//x"), "an empty, '.'"),
    "an empty name": (lambda ck: add_entry(ck, ""), "an empty name"),
    "the manifest listing itself": (lambda ck: add_entry(ck, ckptio.MANIFEST), "list itself"),
    "a symlinked tensor file": (
        lambda ck: symlink_to_a_copy(ck, ckptio.TENSOR_FILE),
        r"'tensors\.safetensors' is a symlink",
    ),
    "a symlinked meta.json": (
        lambda ck: symlink_to_a_copy(ck, ckptio.META_FILE),
        r"'meta\.json' is a symlink",
    ),
    "a symlinked manifest": (
        lambda ck: symlink_to_a_copy(ck, ckptio.MANIFEST),
        r"manifest\.json: is a symlink",
    ),
    "a symlinked subdirectory": (
        lambda ck: (
            (ck.parent.parent / "subdir").mkdir(),
            (ck.parent.parent / "subdir" / "x").write_bytes(b"x"),
            (ck / "sub").symlink_to(ck.parent.parent / "subdir"),
            add_entry(ck, "sub/x"),
        ),
        "'sub' is a symlink",
    ),
    "a symlinked checkpoint directory": (symlinked_directory, f"{NEWEST} is a symlink"),
    "a float CRC equal to the real one": (
        lambda ck: set_entry(
            ck, "crc32", float(manifest_of(ck)["files"][ckptio.TENSOR_FILE]["crc32"])
        ),
        r"has crc32 \d+\.0, not an integer",
    ),
    "a string CRC": (lambda ck: set_entry(ck, "crc32", "0x1234"), "has crc32 '0x1234'"),
    "a negative CRC": (lambda ck: set_entry(ck, "crc32", -1), "has crc32 -1"),
    "a CRC of 33 bits": (lambda ck: set_entry(ck, "crc32", 1 << 32), "has crc32 4294967296"),
    "a boolean CRC": (lambda ck: set_entry(ck, "crc32", True), "has crc32 True"),
    "a float byte count": (
        lambda ck: set_entry(
            ck, "bytes", manifest_of(ck)["files"][ckptio.META_FILE]["bytes"] + 0.0, ckptio.META_FILE
        ),
        r"has bytes \d+\.0, not an integer >= 0",
    ),
    "a negative byte count": (lambda ck: set_entry(ck, "bytes", -5), "has bytes -5"),
    "a string byte count": (lambda ck: set_entry(ck, "bytes", "12"), "has bytes '12'"),
    "an entry that is a list": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "files": {ckptio.TENSOR_FILE: [1, 2]}}),
        "is a list, not an object",
    ),
    "a manifest that is a list": (lambda ck: put_manifest(ck, [1, 2]), "is a JSON list"),
    "a manifest that is a number": (lambda ck: put_manifest(ck, 7), "is a JSON int"),
    "a manifest that is not JSON": (
        lambda ck: (ck / ckptio.MANIFEST).write_bytes(b"\xff{not json"),
        "not JSON",
    ),
    "a manifest nested too deeply": (
        lambda ck: (ck / ckptio.MANIFEST).write_text("[" * 100_000 + "]" * 100_000),
        "not JSON",
    ),
    "a manifest of a future version": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "version": 2}),
        "written by a newer ckptsim",
    ),
    "a manifest version that is a string": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "version": "1"}),
        "version is '1'",
    ),
    "a manifest of another format": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "format": "other"}),
        "format is 'other'",
    ),
    "a manifest without its checksum kind": (
        lambda ck: put_manifest(ck, {k: v for k, v in manifest_of(ck).items() if k != "checksum"}),
        "checksum is None",
    ),
    "a wrong total": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "bytes": "many"}),
        "bytes is 'many'",
    ),
    "a negative tensor count": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "tensors": -1}),
        "tensors is -1",
    ),
    "a manifest padded past 64 MiB": (
        lambda ck: (ck / ckptio.MANIFEST).write_text(
            json.dumps(manifest_of(ck)) + " " * ckptio.MAX_MANIFEST_BYTES
        ),
        "larger than any manifest",
    ),
}


@pytest.mark.parametrize("attack", list(STRUCTURE_ATTACKS))
def test_a_rewritten_manifest_or_planted_file_is_refused_and_the_run_falls_back(run, attack):
    root, at_step_1 = run
    tamper, reason = STRUCTURE_ATTACKS[attack]
    ck = root / NEWEST
    tamper(ck)
    for check in (verify_checkpoint, read_checkpoint):
        with pytest.raises(CorruptCheckpoint, match=reason) as info:
            check(ck)
        one_line(info)
    assert not is_complete(ck)
    resumes_from_step_1(root, at_step_1, reason)


class _Opens:
    """Paths the interpreter opens (audit hook "open"), while recording; hooks cannot be
    removed, so one is installed for the session and switched on and off."""

    recording: list | None = None
    installed = False

    @classmethod
    def hook(cls, event, args):
        if event == "open" and cls.recording is not None and isinstance(args[0], str | bytes):
            cls.recording.append(os.fsdecode(args[0]))

    def __enter__(self):
        if not _Opens.installed:
            sys.addaudithook(_Opens.hook)
            _Opens.installed = True
        _Opens.recording = self.paths = []
        return self

    def __exit__(self, *exc):
        _Opens.recording = None


@pytest.mark.parametrize("escape", ["../../outside", "/abs"])
def test_a_name_outside_the_checkpoint_is_refused_without_being_opened(run, escape):
    root, at_step_1 = run
    ck = root / NEWEST
    target = outside_file(ck)
    name = str(target) if escape == "/abs" else escape
    add_entry(ck, name, target.read_bytes())  # right size and CRC: today it verifies
    with _Opens() as opened:
        with pytest.raises(CorruptCheckpoint, match="relative paths inside it"):
            verify_checkpoint(ck)
        with pytest.raises(CorruptCheckpoint, match="relative paths inside it"):
            read_checkpoint(ck)
        resumes_from_step_1(root, at_step_1, "relative paths inside it")
    assert opened.paths, "the audit hook saw no open at all"
    assert not [p for p in opened.paths if Path(p).resolve() == target.resolve()]


def test_a_fifo_in_a_checkpoint_is_never_opened(run):
    """Opening a FIFO for reading blocks until a writer comes: it must never be opened."""
    root, at_step_1 = run
    ck = root / NEWEST
    os.mkfifo(ck / "pipe")
    add_entry(ck, "pipe", b"")
    with _Opens() as opened:
        resumes_from_step_1(root, at_step_1, "not a regular file")
    assert not [p for p in opened.paths if p.endswith("pipe")]


def test_meta_swapped_for_a_fifo_right_after_the_check_is_never_opened(run, monkeypatch):
    """From the attacker review: the chooser checked meta.json, then opened it again by name,
    so a FIFO renamed over it in between blocked the restore for good (and a symlink would
    have been followed). It is read once, in the bounded non-blocking way, checked as read."""
    import threading

    from simulator.controller import commit

    root, at_step_1 = run
    ck = root / NEWEST
    os.mkfifo(root / "pipe")

    def swap_after(check):
        def checked(path, *members):
            check(path, *members)
            if Path(path).name == NEWEST and (root / "pipe").exists():
                os.replace(root / "pipe", Path(path) / ckptio.META_FILE)

        return checked

    monkeypatch.setattr(commit, "verify_once", swap_after(commit.verify_once))
    monkeypatch.setattr(ckptio, "verify_structure", swap_after(ckptio.verify_structure))
    failed = []

    def restore():
        try:
            resumes_from_step_1(root, at_step_1, "not a regular file")
        except BaseException as exc:  # reported below, in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=restore, daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the reader before failing, so the session can end
        with open(ck / ckptio.META_FILE, "wb"):
            pass
        pytest.fail("the restore blocked opening a FIFO swapped in after the check")
    assert not failed, failed
    assert not (root / "pipe").exists()  # the swap happened


# -- (a)+(b) for files whose bytes were rewritten and resealed --------------------------------
def _offsets_past_the_end(header: str) -> str:
    entries = json.loads(header)
    entries.pop("__metadata__")  # room for the longer number
    name = next(k for k in entries if k != "__metadata__")
    entries[name]["data_offsets"][1] = 10**12
    return json.dumps(entries, separators=(",", ":"))


def _entry_not_an_object(header: str) -> str:
    entries = json.loads(header)
    name = next(k for k in entries if k != "__metadata__")
    entries[name] = 5
    return json.dumps(entries, separators=(",", ":"))


CONTENT_ATTACKS = {
    "header length 2^40": (lambda ck: set_header_length(ck, 1 << 40), "header length"),
    "header length 2^63": (lambda ck: set_header_length(ck, 1 << 63), "header length"),
    "header length 2^64-1": (lambda ck: set_header_length(ck, (1 << 64) - 1), "header length"),
    "header longer than the file": (
        lambda ck: set_header_length(ck, (ck / ckptio.TENSOR_FILE).stat().st_size),
        "exceeds the file",
    ),
    "header that is not JSON": (
        lambda ck: edit_header(ck, lambda h: "{" + "x" * (len(h) - 1)),
        "header is not JSON",
    ),
    "header that is a JSON list": (
        lambda ck: edit_header(ck, lambda h: "[1]"),
        "header is a list, not a JSON object",
    ),
    "header offsets outside the file": (
        lambda ck: edit_header(ck, _offsets_past_the_end),
        "no valid data_offsets",
    ),
    "header entry that is a number": (
        lambda ck: edit_header(ck, _entry_not_an_object),
        "no valid data_offsets",
    ),
    "a tensor count that disagrees": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "tensors": 999}),
        "the manifest says 999",
    ),
    "meta.json a list": (lambda ck: edit_meta(ck, lambda m: [m]), "a JSON list, not an object"),
    "meta.json a number": (lambda ck: edit_meta(ck, lambda m: 3), "a JSON int, not an object"),
    "meta.json not JSON": (lambda ck: edit_meta(ck, lambda m: "{nope"), "not JSON"),
    "meta.json nested too deeply": (
        lambda ck: edit_meta(ck, lambda m: '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        "not JSON",
    ),
}


@pytest.mark.parametrize("attack", list(CONTENT_ATTACKS))
def test_a_resealed_file_with_bad_contents_is_refused_and_the_run_falls_back(run, attack):
    root, at_step_1 = run
    tamper, reason = CONTENT_ATTACKS[attack]
    ck = root / NEWEST
    tamper(ck)
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        read_checkpoint(ck)
    one_line(info)
    resumes_from_step_1(root, at_step_1, reason)


# -- (a)+(b) for a state that decodes to something restore cannot take ------------------------
def _rng(meta):
    return meta["rng"]


def _torch_rng_points_at(name):
    def change(meta):
        _rng(meta)["torch"] = {"__tensor__": name}
        return meta

    return change


def _tuple_state(meta, key):
    return _rng(meta)[key]["__tuple__"]


STATE_ATTACKS = {
    "torch RNG as a float tensor": (
        lambda ck: edit_meta(ck, _torch_rng_points_at("model/0.weight")),
        r"\['torch'\] is torch\.float32 \(8, 8\), not a 1-D uint8 CPU tensor",
    ),
    "torch RNG reshaped": (
        lambda ck: edit_tensors(
            ck, lambda t: t.update({"rng/torch": t["rng/torch"].reshape(2, -1).clone()})
        ),
        r"torch\.uint8 \(2, 2528\), not a 1-D",
    ),
    "torch RNG cut short": (
        lambda ck: edit_tensors(
            ck, lambda t: t.update({"rng/torch": t["rng/torch"][:100].clone()})
        ),
        r"\['torch'\] is refused by its generator",
    ),
    "torch RNG with float bytes of the right count": (
        lambda ck: edit_tensors(ck, lambda t: t.update({"rng/torch": t["rng/torch"].float()})),
        r"torch\.float32 \(5056,\)",
    ),
    "python RNG a list, not a tuple": (
        lambda ck: edit_meta(
            ck, lambda m: {**m, "rng": {**m["rng"], "python": _tuple_state(m, "python")}}
        ),
        r"\['python'\] is \[3,",
    ),
    "python RNG with a short vector": (
        lambda ck: edit_meta(
            ck,
            lambda m: {
                **m,
                "rng": {**m["rng"], "python": {"__tuple__": [3, {"__tuple__": [1, 2, 3]}, None]}},
            },
        ),
        r"\['python'\] is refused by its generator",
    ),
    "numpy RNG of another generator": (
        lambda ck: edit_meta(
            ck,
            lambda m: (_tuple_state(m, "numpy").__setitem__(0, "PCG64"), m)[1],
        ),
        r"\['numpy'\] is refused by its generator",
    ),
    "numpy RNG as an object array": (
        lambda ck: edit_meta(
            ck,
            lambda m: (
                _tuple_state(m, "numpy")[1]["__ndarray__"].__setitem__(0, "|O"),
                m,
            )[1],
        ),
        r"dtype '\|O' is not a bool, integer or float dtype",
    ),
    # From the attacker review: NumPy's parser raised ValueError on these, which escaped.
    "numpy RNG with a malformed subarray dtype": (
        lambda ck: edit_meta(
            ck,
            lambda m: (
                _tuple_state(m, "numpy")[1]["__ndarray__"].__setitem__(0, "(-1,)f8"),
                m,
            )[1],
        ),
        r"dtype '\(-1,\)f8' is not a bool, integer or float dtype",
    ),
    "a config NumPy scalar with a huge subarray dtype": (
        lambda ck: edit_meta(
            ck,
            lambda m: {
                **m,
                "config": {"x": {"__npscalar__": ["(99999999999999999999,)i1", 1]}},
            },
        ),
        r"dtype '\(99999999999999999999,\)i1' is not a bool",
    ),
    "a config NumPy scalar of a record dtype": (
        lambda ck: edit_meta(
            ck, lambda m: {**m, "config": {"x": {"__npscalar__": ["<i8,<f8", 1]}}}
        ),
        r"dtype '<i8,<f8' is not a bool",
    ),
    "a tensor reference the file lacks": (
        lambda ck: edit_meta(ck, _torch_rng_points_at("no/such/tensor")),
        "names tensor 'no/such/tensor', which the tensor file does not hold",
    ),
    "a step that is a string": (
        lambda ck: edit_meta(ck, lambda m: {**m, "step": "2"}),
        "step is '2'",
    ),
    "a negative step": (lambda ck: edit_meta(ck, lambda m: {**m, "step": -2}), "step is -2"),
    "a fractional step": (lambda ck: edit_meta(ck, lambda m: {**m, "step": 2.5}), "step is 2.5"),
    "unknown controller estimates": (
        lambda ck: edit_meta(ck, lambda m: {**m, "controller": {"bogus": 1}}),
        "controller estimate 'bogus'",
    ),
    "a controller estimate that is a string": (
        lambda ck: edit_meta(ck, lambda m: {**m, "controller": {"write_s": "fast"}}),
        "controller estimate 'write_s' = 'fast'",
    ),
    "a model section that is a list": (
        lambda ck: edit_meta(ck, lambda m: {**m, "model": [1]}),
        "model is a list, not a dict",
    ),
    "a config that is a list": (
        lambda ck: edit_meta(ck, lambda m: {**m, "config": [1]}),
        "config is a list, not a dict",
    ),
    "a state that is a tuple": (
        lambda ck: edit_meta(ck, lambda m: {"__tuple__": [1, 2]}),
        "a tuple, not a dict",
    ),
    "a tagged dict with a bad value": (
        lambda ck: edit_meta(ck, lambda m: {**m, "config": {"__bytes__": 5}}),
        r"at state\['config'\]\['__bytes__'\]: 5 is not base64",
    ),
}


@pytest.mark.parametrize("attack", list(STATE_ATTACKS))
def test_a_resealed_state_that_is_malformed_is_corrupt_and_the_run_falls_back(run, attack):
    root, at_step_1 = run
    tamper, reason = STATE_ATTACKS[attack]
    ck = root / NEWEST
    tamper(ck)
    verify_checkpoint(ck)  # every byte matches the rewritten manifest
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        check_state(LocalBackend().read(ck, {}), where=ck.name)
    assert NEWEST in one_line(info)
    resumes_from_step_1(root, at_step_1, reason)


def test_restore_state_refuses_a_malformed_rng_before_loading_anything(run):
    root, _ = run
    ck = root / NEWEST
    edit_meta(ck, _torch_rng_points_at("model/0.weight"))
    state = LocalBackend().read(ck, {})
    model, opt = make_run(seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    random.seed(11)
    torch.manual_seed(11)
    expect = (random.random(), torch.rand(1))
    random.seed(11)
    torch.manual_seed(11)
    with pytest.raises(CorruptCheckpoint, match="not a 1-D uint8 CPU tensor"):
        restore_state(state, model=model, optimizer=opt)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert (random.random(), torch.rand(1)) == expect  # no generator was touched


def test_a_well_formed_state_that_does_not_fit_is_incompatible_not_a_raw_type_error(run):
    """The optimizer's own load_state_dict judges its section: a TypeError there is a clear
    IncompatibleCheckpoint (a stop), where it used to escape restore() as a raw TypeError."""
    root, _ = run
    edit_meta(root / NEWEST, lambda m: {**m, "optimizer": {**m["optimizer"], "param_groups": 5}})
    model, opt = make_run(seed=99)
    ck = AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9))
    with pytest.raises(IncompatibleCheckpoint, match="optimizer state does not load") as info:
        ck.restore()
    ck.close()
    assert "does not fit this run" in one_line(info)


# -- distributed (DCP) checkpoints sealed by write_manifest -----------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dcp_run(tmp_path):
    """Two DCP checkpoints written through the checkpointer in a one-rank gloo group."""
    import torch.distributed as dist

    from simulator.controller.distributed import DistributedBackend

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        root = tmp_path / "run"
        model, opt = make_run()

        def checkpointer(model, opt):
            return AdaptiveCheckpointer(
                root,
                model=model,
                optimizer=opt,
                backend=DistributedBackend(),
                policy=FixedInterval(1e9),
            )

        with checkpointer(model, opt) as ck:
            train(model, opt)
            ck.save(1)
            at_step_1 = {k: v.clone() for k, v in model.state_dict().items()}
            train(model, opt)
            ck.save(2)
        yield root, at_step_1, checkpointer
    finally:
        dist.destroy_process_group()


def _drop(ck: Path, name: str, *, keep_file: bool = False) -> None:
    if not keep_file:
        (ck / name).unlink()
    manifest = manifest_of(ck)
    del manifest["files"][name]
    put_manifest(ck, manifest)
    reseal(ck)


DCP_ATTACKS = {
    "files emptied": (lambda ck: reseal(ck, files={}, bytes=0), "not a non-empty object"),
    "DCP's .metadata removed with its entry": (
        lambda ck: _drop(ck, ".metadata"),
        r"\.metadata is not listed|'\.metadata' listed",
    ),
    "rank 0's data file removed with its entry": (
        lambda ck: _drop(ck, "__0_0.distcp"),
        r"rank 0's data file __0_0\.distcp is not listed",
    ),
    "a data file unlisted": (
        lambda ck: _drop(ck, "__0_0.distcp", keep_file=True),
        r"'__0_0\.distcp' is not listed",
    ),
    "a rank count the files do not back": (
        lambda ck: put_manifest(ck, {**manifest_of(ck), "ranks": 2}),
        r"rank 1's data file __1_0\.distcp is not listed",
    ),
}


@pytest.mark.parametrize("attack", list(DCP_ATTACKS))
def test_a_tampered_dcp_checkpoint_is_refused_and_the_run_falls_back(dcp_run, attack):
    root, at_step_1, checkpointer = dcp_run
    tamper, reason = DCP_ATTACKS[attack]
    ck = root / NEWEST
    assert manifest_of(ck)["ranks"] == 1 and ".metadata" in manifest_of(ck)["files"]
    verify_checkpoint(ck)
    tamper(ck)
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        verify_checkpoint(ck)
    one_line(info)
    model, opt = make_run(seed=99)
    ck = checkpointer(model, opt)
    with pytest.warns(UserWarning, match=reason):
        assert ck.restore() == 1
    ck.close()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in at_step_1.items())


def test_a_dcp_manifest_from_before_rank_counts_still_verifies(dcp_run):
    root, _, _ = dcp_run
    manifest = manifest_of(root / NEWEST)
    del manifest["ranks"]
    put_manifest(root / NEWEST, manifest)
    verify_checkpoint(root / NEWEST)
    assert {".rank-0.ok"} <= {p.name for p in (root / NEWEST).iterdir()}  # allowed unlisted


def test_sealing_a_directory_with_a_symlink_is_a_write_error(tmp_path):
    from simulator.controller import CheckpointWriteError

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "data").write_bytes(b"abc")
    (tmp_path / "ck" / "link").symlink_to(tmp_path / "ck" / "data")
    with pytest.raises(CheckpointWriteError, match="'link' is a symlink"):
        write_manifest(tmp_path / "ck")
    assert not (tmp_path / "ck" / ckptio.MANIFEST).exists()


def test_numpy_and_python_rng_survive_the_checks_exactly(run):
    """The checks refuse nothing a real save holds: a restored run draws what it would have."""
    root, _ = run
    model, opt = make_run(seed=3)
    random.seed(4)
    np.random.seed(4)  # noqa: NPY002
    torch.manual_seed(4)
    ck = AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9))
    ck.restore()
    ck.save(3)
    want = (random.random(), np.random.random(), torch.rand(1))  # noqa: NPY002
    ck.close()
    ck = AdaptiveCheckpointer(root, model=model, optimizer=opt, policy=FixedInterval(1e9))
    assert ck.restore() == 3
    ck.close()
    assert (random.random(), np.random.random(), torch.rand(1)) == want  # noqa: NPY002
