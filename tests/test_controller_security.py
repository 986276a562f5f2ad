"""A checkpoint written by an attacker must not run code when the controller restores it.

DCP's ``.metadata`` is a pickle. Every payload here is written by hand, opcode by opcode, in
the ways known to get past restricted unpicklers (dotted names through an allowed module,
builtins reached through a module attribute, getattr/attrgetter chains, STACK_GLOBAL with
strings fetched from the memo, INST, OBJ, copyreg extension codes, persistent ids, BUILD on an
allowed class, a real metadata file with a gadget planted deep inside). Each is first shown to
work against the plain unpickler (so the test can fail), then must be refused with
``UnsafeCheckpoint`` and no side effect: by the metadata reader itself, by
``DistributedBackend.read``, and end to end by ``AdaptiveCheckpointer.restore`` on a real DCP
checkpoint whose ``.metadata`` was replaced and whose manifest CRC was recomputed, as an
attacker who can write the directory would.
"""

from __future__ import annotations

import copyreg
import json
import os
import pickle
import pickletools
import shlex
import shutil
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from _dist import free_port

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, UnsafeCheckpoint
from simulator.controller.integrity import CorruptCheckpoint, refuse_pickles
from simulator.policies import FixedInterval

PosixPath = type(Path())


# -- pickle opcodes, by hand -----------------------------------------------------------------
def _str(s: str, proto: int) -> bytes:
    """A string: UNICODE (text) in protocol 0, BINUNICODE in 1-3, SHORT_BINUNICODE in 4-5."""
    b = s.encode()
    if proto == 0:
        return pickle.UNICODE + s.encode("raw_unicode_escape") + b"\n"
    if proto < 4:
        return pickle.BINUNICODE + struct.pack("<I", len(b)) + b
    return pickle.SHORT_BINUNICODE + bytes([len(b)]) + b


def _head(proto: int) -> bytes:
    return pickle.PROTO + bytes([proto]) if proto >= 2 else b""


def _global(module: str, name: str, proto: int) -> bytes:
    if proto >= 4:
        return _str(module, proto) + _str(name, proto) + pickle.STACK_GLOBAL
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def _call(func: bytes, *args: bytes) -> bytes:
    """``func(*args)``: MARK, the arguments, TUPLE, REDUCE."""
    return func + pickle.MARK + b"".join(args) + pickle.TUPLE + pickle.REDUCE


def _touch(marker: Path) -> str:
    return f"touch {shlex.quote(str(marker))}"


@dataclass(frozen=True)
class Attack:
    name: str
    build: Callable[[Path], bytes]  # marker path -> the pickle
    # The side effect, if the payload ran (default: the marker file exists).
    happened: Callable[[Path], bool] = lambda marker: marker.exists()
    runs_under_plain_pickle: bool = True


def _system_in(proto: int) -> Attack:
    def build(marker):
        return _head(proto) + _call(_global("os", "system", proto), _str(_touch(marker), proto))

    return Attack(
        f"os.system by {'STACK_GLOBAL' if proto >= 4 else 'GLOBAL'}, protocol {proto}", build
    )


def _dotted(module: str, name: str, arg: Callable[[Path], str], opcode: str) -> Attack:
    def build(marker):
        if opcode == "STACK_GLOBAL":
            func = _global(module, name, 4)
        else:  # GLOBAL in a protocol-4 stream: the plain unpickler walks dotted names too
            func = pickle.GLOBAL + f"{module}\n{name}\n".encode()
        return _head(4) + _call(func, *(_str(a, 4) for a in arg(marker))) + pickle.STOP

    return Attack(f"{module} + {name} by {opcode}", build)


def _exec_cmd(marker):
    return (f"import os; os.system({_touch(marker)!r})",)


def _open_w(marker):
    return (str(marker), "w")


def _cmd(marker):
    return (_touch(marker),)


def _pickle_loads_gadget(marker: Path) -> bytes:
    # pickle.loads, reached through an allowed module, unpickling an inner os.system payload.
    inner = pickle.dumps(_Gadget(_touch(marker)))
    return (
        _head(4)
        + _global("torch.distributed.checkpoint.filesystem", "pickle.loads", 4)
        + pickle.SHORT_BINBYTES
        + bytes([len(inner)])
        + inner
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )


def _getattr_chain(marker: Path) -> bytes:
    # builtins.getattr(builtins.__import__("os"), "system")(cmd), protocol 2.
    imp = _call(_global("builtins", "__import__", 2), _str("os", 2))
    system = _call(_global("builtins", "getattr", 2), imp, _str("system", 2))
    return _head(2) + _call(system, _str(_touch(marker), 2)) + pickle.STOP


def _getattr_through_torch(marker: Path) -> bytes:
    # torch.builtins.getattr: builtins reached as an attribute of an allowed module.
    imp = _call(_global("torch", "builtins.__import__", 4), _str("os", 4))
    system = _call(_global("torch", "builtins.getattr", 4), imp, _str("system", 4))
    return _head(4) + _call(system, _str(_touch(marker), 4)) + pickle.STOP


def _attrgetter_chain(marker: Path) -> bytes:
    # operator.attrgetter("path.os.system")(pathlib-imported os module ...), protocol 3.
    getter = _call(_global("operator", "attrgetter", 3), _str("system", 3))
    os_module = _call(_global("importlib", "import_module", 3), _str("os", 3))
    system = _call(getter, os_module)
    return _head(3) + _call(system, _str(_touch(marker), 3)) + pickle.STOP


def _memo_strings(marker: Path) -> bytes:
    # STACK_GLOBAL whose strings come from the memo, behind decoy strings of an allowed class:
    # a scanner that reads "the last two strings" sees torch.Size.
    p = 4
    return (
        _head(p)
        + _str("posix", p)
        + pickle.MEMOIZE  # memo 0
        + pickle.POP
        + _str("system", p)
        + pickle.MEMOIZE  # memo 1
        + pickle.POP
        + _str("torch", p)
        + _str("Size", p)
        + pickle.POP
        + pickle.POP
        + pickle.BINGET
        + b"\x00"
        + pickle.BINGET
        + b"\x01"
        + pickle.STACK_GLOBAL
        + _str(_touch(marker), p)
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )


def _inst(marker: Path) -> bytes:  # protocol 0: INST calls the class it names
    return pickle.MARK + _str(_touch(marker), 0) + pickle.INST + b"os\nsystem\n" + pickle.STOP


def _obj(marker: Path) -> bytes:  # protocol 1: OBJ calls the object under the mark
    return (
        pickle.MARK
        + _global("os", "system", 1)
        + _str(_touch(marker), 1)
        + pickle.OBJ
        + pickle.STOP
    )


EXT_CODES = {"EXT1": 0xF1, "EXT2": 0xF1F1, "EXT4": 0x7F1F1F1F}
_EXT_OPS = {"EXT1": (pickle.EXT1, "<B"), "EXT2": (pickle.EXT2, "<H"), "EXT4": (pickle.EXT4, "<i")}


def _ext(kind: str) -> Callable[[Path], bytes]:
    op, fmt = _EXT_OPS[kind]

    def build(marker):
        func = op + struct.pack(fmt, EXT_CODES[kind])
        return _head(2) + func + _str(_touch(marker), 2) + pickle.TUPLE1 + pickle.REDUCE + b"."

    return build


HIJACK = "/tmp/ckptsim-hijacked-path"


def _build_on_posixpath(marker: Path) -> bytes:
    # BUILD on the class object with a slot state: setattr(PosixPath, "_str", HIJACK), after
    # which str() and open() of EVERY PosixPath in the process give HIJACK.
    p = 4
    return (
        _head(p)
        + _global(PosixPath.__module__, PosixPath.__qualname__, p)
        + pickle.NONE
        + pickle.EMPTY_DICT
        + _str("_str", p)
        + _str(HIJACK, p)
        + pickle.SETITEM
        + pickle.TUPLE2
        + pickle.BUILD
        + pickle.STOP
    )


def _build_setstate_on_class(marker: Path) -> bytes:
    # BUILD on an allowed class object giving it a __setstate__ (here: PosixPath).
    p = 4
    return (
        _head(p)
        + _global("torch.distributed.checkpoint.metadata", "StorageMeta", p)
        + pickle.NONE
        + pickle.EMPTY_DICT
        + _str("__setstate__", p)
        + _global(PosixPath.__module__, PosixPath.__qualname__, p)
        + pickle.SETITEM
        + pickle.TUPLE2
        + pickle.BUILD
        + pickle.STOP
    )


def _build_class_swap(marker: Path) -> bytes:
    # BUILD with a slot state on an instance: __class__ becomes another allowed class.
    p = 4
    md = "torch.distributed.checkpoint.metadata"
    return (
        _head(p)
        + _global(md, "StorageMeta", p)
        + pickle.EMPTY_TUPLE
        + pickle.NEWOBJ
        + pickle.NONE
        + pickle.EMPTY_DICT
        + _str("__class__", p)
        + _global(md, "BytesStorageMetadata", p)
        + pickle.SETITEM
        + pickle.TUPLE2
        + pickle.BUILD
        + pickle.STOP
    )


class _Gadget:
    def __init__(self, cmd: str):
        self.cmd = cmd

    def __reduce__(self):
        return (os.system, (self.cmd,))


def _real_metadata() -> object:
    return pickle.loads(Path(_REAL_METADATA[0]).read_bytes())  # trusted: the test wrote it


def _through_allowed_module(data: bytes) -> bytes:
    """``data`` with its posix.system global renamed filesystem + "os.system" (frames dropped).

    The names DCP's metadata legitimately uses come from that module, so an allow-list of
    whole modules would let this planted call through.
    """
    rename = {"posix": "torch.distributed.checkpoint.filesystem", "system": "os.system"}
    ops = list(pickletools.genops(data))
    out = []
    for (op, arg, pos), (_, _, end) in zip(ops, [*ops[1:], (None, None, len(data))], strict=True):
        if op.name == "FRAME":  # optional; its length would be wrong after the rename
            continue
        if op.name == "SHORT_BINUNICODE" and arg in rename:
            out.append(_str(rename[arg], 4))
        else:
            out.append(data[pos:end])
    return b"".join(out)


def _planted_in_modules(marker: Path) -> bytes:
    md = _real_metadata()
    md.storage_meta.modules = ["torch", _Gadget(_touch(marker))]
    return _through_allowed_module(pickle.dumps(md, protocol=4))


def _planted_in_a_chunk(marker: Path) -> bytes:
    md = _real_metadata()
    entry = next(v for v in md.state_dict_metadata.values() if hasattr(v, "chunks"))
    entry.chunks.append(_Gadget(_touch(marker)))
    return _through_allowed_module(pickle.dumps(md, protocol=4))


ATTACKS = [
    *(_system_in(p) for p in range(6)),
    _dotted("torch.distributed.checkpoint.filesystem", "os.system", _cmd, "STACK_GLOBAL"),
    _dotted("torch.distributed.checkpoint.filesystem", "os.system", _cmd, "GLOBAL"),
    _dotted("torch.distributed.checkpoint.metadata", "os.system", _cmd, "STACK_GLOBAL"),
    _dotted("torch.serialization", "os.system", _cmd, "GLOBAL"),
    _dotted("torch.distributed.checkpoint.planner", "io.open", _open_w, "STACK_GLOBAL"),
    _dotted("pathlib", "io.open", _open_w, "STACK_GLOBAL"),
    _dotted("torch", "builtins.exec", _exec_cmd, "STACK_GLOBAL"),
    _dotted("torch", "serialization.os.system", _cmd, "STACK_GLOBAL"),
    Attack("pickle.loads through filesystem, of an os.system payload", _pickle_loads_gadget),
    Attack("builtins.getattr(__import__('os'), 'system')", _getattr_chain),
    Attack("torch.builtins.getattr chain", _getattr_through_torch),
    Attack("operator.attrgetter chain", _attrgetter_chain),
    Attack("STACK_GLOBAL with strings from the memo", _memo_strings),
    Attack("INST, protocol 0", _inst),
    Attack("OBJ, protocol 1", _obj),
    *(Attack(f"{kind}, a copyreg extension code", _ext(kind)) for kind in EXT_CODES),
    Attack(
        "PERSID",
        lambda marker: pickle.PERSID + b"storage\n" + pickle.STOP,
        runs_under_plain_pickle=False,
    ),
    Attack(
        "BINPERSID",
        lambda marker: _head(2) + _str("storage", 2) + pickle.BINPERSID + pickle.STOP,
        runs_under_plain_pickle=False,
    ),
    Attack(
        "BUILD on the PosixPath class (redirects every path)",
        _build_on_posixpath,
        happened=lambda marker: "_str" in vars(PosixPath),
    ),
    Attack(
        "BUILD giving an allowed class a __setstate__",
        _build_setstate_on_class,
        happened=lambda marker: "__setstate__" in vars(_storage_meta_cls()),
    ),
    Attack(
        "BUILD swapping an instance's __class__",
        _build_class_swap,
        happened=lambda marker: False,  # type confusion, nothing to see afterwards
        runs_under_plain_pickle=False,
    ),
    Attack("real metadata, os.system planted in storage_meta.modules", _planted_in_modules),
    Attack("real metadata, os.system planted in a tensor's chunks", _planted_in_a_chunk),
]
ATTACK_IDS = [a.name for a in ATTACKS]


def _storage_meta_cls():
    from torch.distributed.checkpoint.metadata import StorageMeta

    return StorageMeta


# -- fixtures --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_rank():
    """A one-process gloo group in this process: enough for DCP's file handling."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def _checkpointer(root: Path, model, opt, now: list[float] | None = None) -> AdaptiveCheckpointer:
    from simulator.controller.distributed import DistributedBackend

    now = [0.0] if now is None else now
    return AdaptiveCheckpointer(
        root,
        model=model,
        optimizer=opt,
        policy=FixedInterval(1.0),
        backend=DistributedBackend(),
        clock=lambda: now[0],
        probe_steps=1,
        keep_last=2,
    )


_REAL_METADATA: list[str] = []


@pytest.fixture(scope="module")
def dcp_run(one_rank, tmp_path_factory) -> Path:
    """A real run's directory: two DCP checkpoints written by the controller."""
    root = tmp_path_factory.mktemp("security") / "run"
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    now = [0.0]
    ckpt = _checkpointer(root, model, opt, now)
    assert ckpt.restore() == 0
    for step in range(1, 5):
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        opt.zero_grad()
        now[0] += 1.0
        ckpt.step(step)
    ckpt.close()
    steps = sorted(p for p in root.glob("step-*"))
    assert len(steps) == 2
    _REAL_METADATA[:] = [str(steps[-1] / ".metadata")]
    return root


# Each code names a shell-running callable; EXT4's is also in copyreg's process-wide cache.
EXT_KEYS = {
    "EXT1": ("posix", "system"),
    "EXT2": ("os", "system"),
    "EXT4": ("subprocess", "getoutput"),
}


@pytest.fixture
def armed(request):
    """What an attack relies on being there: extension codes, for the EXT payloads."""
    if request.node.callspec.params["attack"].name.startswith("EXT"):
        request.getfixturevalue("extension_codes")


@pytest.fixture
def extension_codes():
    """Shell-running callables registered under copyreg extension codes."""
    import subprocess

    for kind, code in EXT_CODES.items():
        copyreg.add_extension(*EXT_KEYS[kind], code)
    # Any earlier ordinary unpickle of the code leaves the callable in copyreg's cache, which
    # the C unpickler answers from without asking find_class.
    copyreg._extension_cache[EXT_CODES["EXT4"]] = subprocess.getoutput
    yield
    for kind, code in EXT_CODES.items():
        copyreg.remove_extension(*EXT_KEYS[kind], code)
        copyreg._extension_cache.pop(code, None)


@pytest.fixture
def clean_classes():
    """Undo what a BUILD-on-a-class payload did, if one ever ran."""
    yield
    for cls, attr in ((PosixPath, "_str"), (_storage_meta_cls(), "__setstate__")):
        if attr in vars(cls):
            delattr(cls, attr)


def _tampered_copy(run: Path, dest: Path, payload: bytes) -> Path:
    """A copy of the run whose newest checkpoint's .metadata is ``payload``, manifest updated."""
    shutil.copytree(run, dest)
    newest = max(dest.glob("step-*"))
    (newest / ".metadata").write_bytes(payload)
    manifest_path = newest / ckptio.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    entry = manifest["files"][".metadata"]
    manifest["bytes"] += len(payload) - entry["bytes"]
    entry.update(bytes=len(payload), crc32=ckptio.file_crc32(newest / ".metadata"))
    manifest_path.write_text(json.dumps(manifest))
    ckptio.verify_checkpoint(newest)  # the checksums are no obstacle
    return newest


# -- the attacks are real ------------------------------------------------------------------
@pytest.mark.parametrize(
    "attack",
    [a for a in ATTACKS if a.runs_under_plain_pickle],
    ids=[a.name for a in ATTACKS if a.runs_under_plain_pickle],
)
def test_every_payload_runs_its_code_under_the_plain_unpickler(
    attack, dcp_run, tmp_path, armed, clean_classes
):
    marker = tmp_path / "executed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            pickle.loads(attack.build(marker))
        except Exception:
            pass  # some gadgets fail after their side effect (os.system's int as a BUILD)
    assert attack.happened(marker)


# -- and are refused -----------------------------------------------------------------------
@pytest.mark.parametrize("attack", ATTACKS, ids=ATTACK_IDS)
def test_the_metadata_reader_refuses_every_payload_without_running_it(
    attack, dcp_run, tmp_path, armed, clean_classes
):
    from simulator.controller.safe_metadata import loads_metadata

    marker = tmp_path / "executed"
    with pytest.raises(UnsafeCheckpoint, match="refusing"):
        loads_metadata(attack.build(marker))
    assert not attack.happened(marker)


@pytest.mark.parametrize("attack", ATTACKS, ids=ATTACK_IDS)
def test_the_distributed_backend_refuses_a_tampered_metadata_without_running_it(
    attack, dcp_run, tmp_path, armed, clean_classes
):
    from simulator.controller.distributed import DistributedBackend

    marker = tmp_path / "executed"
    newest = _tampered_copy(dcp_run, tmp_path / "run", attack.build(marker))
    model = _model()
    template = {"model": model.state_dict(), "step": 0}
    with pytest.raises(UnsafeCheckpoint):
        DistributedBackend().read(newest, template)
    assert not attack.happened(marker)


@pytest.mark.parametrize("attack", ATTACKS, ids=ATTACK_IDS)
def test_restore_refuses_a_tampered_checkpoint_loudly_and_does_not_fall_back(
    attack, dcp_run, tmp_path, armed, clean_classes
):
    marker = tmp_path / "executed"
    newest = _tampered_copy(dcp_run, tmp_path / "run", attack.build(marker))
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ckpt = _checkpointer(tmp_path / "run", model, opt)
    with pytest.raises(UnsafeCheckpoint, match=newest.name):
        ckpt.restore()
    ckpt.close()
    assert not attack.happened(marker)
    # Not silently skipped for the older intact one, and left in place for a person to see.
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert (newest / ".metadata").read_bytes() == attack.build(marker)


# -- what the metadata may point at ----------------------------------------------------------
def _retargeted(run: Path, target: str) -> bytes:
    md = pickle.loads(max(run.glob("step-*")).joinpath(".metadata").read_bytes())
    first = next(iter(md.storage_data))
    md.storage_data[first].relative_path = target
    return pickle.dumps(md)


@pytest.mark.parametrize("target", ["../../outside.distcp", "/etc/hostname", "sub/x", ".."])
def test_metadata_pointing_outside_its_checkpoint_is_refused(dcp_run, tmp_path, target):
    from simulator.controller.distributed import DistributedBackend

    newest = _tampered_copy(dcp_run, tmp_path / "run", _retargeted(dcp_run, target))
    (tmp_path / "outside.distcp").write_bytes(b"\x00" * 64)
    with pytest.raises(UnsafeCheckpoint, match="not a file of this checkpoint"):
        DistributedBackend().read(newest, {"model": _model().state_dict(), "step": 0})


def test_an_allowed_class_planted_as_a_value_is_refused(dcp_run):
    from torch.distributed.checkpoint.metadata import Metadata

    from simulator.controller.safe_metadata import loads_metadata

    md = _real_metadata()
    md.planner_data[next(iter(md.planner_data))] = Metadata  # pickles as a global reference
    with pytest.raises(UnsafeCheckpoint, match="planner_data"):
        loads_metadata(pickle.dumps(md))


def test_a_torn_metadata_is_corrupt_not_unsafe(dcp_run):
    from simulator.controller.safe_metadata import loads_metadata

    data = Path(_REAL_METADATA[0]).read_bytes()
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        loads_metadata(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint, match="unreadable"):
        loads_metadata(b"\x80\x04\x95" + struct.pack("<Q", 2**62) + b"\x8c")


# -- what real checkpoints need, and nothing more -------------------------------------------
def test_real_dcp_metadata_reads_back_equal_to_what_dcp_wrote(dcp_run):
    from simulator.controller.safe_metadata import load_metadata

    for step_dir in sorted(dcp_run.glob("step-*")):
        want = pickle.loads((step_dir / ".metadata").read_bytes())
        assert load_metadata(step_dir) == want
    # ... and the run resumes through it.
    model = _model()
    ckpt = _checkpointer(dcp_run, model, torch.optim.AdamW(model.parameters(), lr=0.01))
    assert ckpt.restore() == 4
    ckpt.close()


def test_the_allow_list_names_classes_and_dtypes_only_besides_the_layout_lookup():
    import types

    from simulator.controller import safe_metadata

    names, _, _ = safe_metadata._tables()
    for (module, name), value in names.items():
        assert "." not in name, (module, name)
        assert not isinstance(value, types.ModuleType)
        if value is safe_metadata._layout:
            assert (module, name) == ("torch.serialization", "_get_layout")
        else:
            assert isinstance(value, type | torch.dtype), (module, name, value)


# -- files a single-process checkpoint must never carry --------------------------------------
def _pickle_files(folder: Path) -> dict[str, bytes]:
    buf = folder / "archive.bin"
    torch.save({"w": torch.ones(2)}, buf)
    return {
        "protocol0.json": pickle.dumps({"a": 1}, protocol=0),
        "protocol1.safetensors": pickle.dumps([1, 2], protocol=1),
        "protocol4.bin": pickle.dumps({"a": 1}, protocol=4),
        "weights.safetensors": buf.read_bytes(),  # a torch.save archive under another name
    }


@pytest.mark.parametrize(
    "name", ["protocol0.json", "protocol1.safetensors", "protocol4.bin", "weights.safetensors"]
)
def test_a_pickle_of_any_protocol_under_any_name_is_refused(tmp_path, name):
    model = _model()
    ckpt = AdaptiveCheckpointer(tmp_path / "run", model=model, probe_steps=1)
    ckpt.restore()
    ckpt.save(1)
    ckpt.close()
    step_dir = max((tmp_path / "run").glob("step-*"))
    payload = _pickle_files(tmp_path)[name]
    (step_dir / name).write_bytes(payload)
    with pytest.raises(UnsafeCheckpoint, match=name):
        refuse_pickles(step_dir)


def test_checkpoint_files_themselves_are_not_taken_for_pickles(tmp_path):
    model = _model()
    ckpt = AdaptiveCheckpointer(tmp_path / "run", model=model, probe_steps=1)
    ckpt.restore()
    ckpt.save(1)
    ckpt.close()
    step_dir = max((tmp_path / "run").glob("step-*"))
    refuse_pickles(step_dir)  # safetensors and JSON only: nothing raised
    assert not zipfile.is_zipfile(next(step_dir.glob("*.safetensors")))


def test_the_layout_lookup_answers_only_torch_layout_names():
    from simulator.controller.safe_metadata import loads_metadata

    def layout_of(name) -> bytes:
        get = _global("torch.serialization", "_get_layout", 4)
        return _head(4) + get + name + pickle.TUPLE1 + pickle.REDUCE + pickle.STOP

    with pytest.raises(UnsafeCheckpoint, match="not a torch layout"):
        loads_metadata(layout_of(_str("__class__", 4)))
    with pytest.raises(UnsafeCheckpoint, match="not a torch layout"):
        loads_metadata(layout_of(pickle.EMPTY_LIST))
    # A real layout name resolves (and the whole is then refused for not being a Metadata).
    with pytest.raises(UnsafeCheckpoint, match="not a DCP Metadata"):
        loads_metadata(layout_of(_str("torch.strided", 4)))
