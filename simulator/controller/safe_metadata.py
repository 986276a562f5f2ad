"""DCP's ``.metadata`` read without letting the file run code.

torch.distributed.checkpoint (DCP) records what a checkpoint holds in ``.metadata``, a plain
pickle, and loads it with ``pickle.load``: whoever can write that file can run any code in the
training job, and the manifest's CRC is no defence (a hostile writer recomputes it). torch 2.13
has no pickle-free reader for the checkpoints DCP's ``FileSystemWriter`` makes (the
``HuggingFaceStorageReader`` rebuilds metadata from safetensors headers, but knows tensors
only: no byte entries, no ``planner_data``), so this module reads the pickle itself, as data:

* **exact names** -- a global resolves only if its ``(module, qualname)`` pair is one of the
  classes, dtypes and the layout lookup that DCP's metadata is made of (found by writing real
  checkpoints: one and two ranks, plain, DDP and FSDP2 DTensor state). No dotted name, no
  attribute walk, no module; the one function, torch's ``_get_layout``, is replaced by a strict
  lookup of its own;
* **every opcode checked** -- it runs the standard library's reference unpickler
  (``pickle._Unpickler``) with its dispatch table cut down: calls (REDUCE, NEWOBJ, NEWOBJ_EX)
  only of an allowed class or the layout lookup, with a tuple of arguments; BUILD only on an
  *instance* of a metadata dataclass and only its declared fields (a BUILD on a class object
  would otherwise ``setattr`` on it and rewire, say, ``pathlib`` for the whole process); items
  added only to real lists, dicts and sets. INST, OBJ, the copyreg extension codes (EXT1/2/4,
  which the C unpickler answers from a process-wide cache without asking ``find_class``) and
  persistent ids are refused outright. The pure-Python unpickler is about three times slower
  than the C one (seconds for a metadata of tens of thousands of shards), once per restore;
* **the result checked** -- the loaded object must be a :class:`Metadata` of exactly the
  expected shape (types of every field), and every storage entry must name a plain file of the
  checkpoint directory, so a tampered file cannot point the load at files elsewhere.

A refusal is :class:`~simulator.controller.integrity.UnsafeCheckpoint`; a file that is not a
readable pickle (torn, truncated) is :class:`~simulator.controller.integrity.CorruptCheckpoint`.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import pickle
from pathlib import Path, PurePath
from typing import Any

from simulator.controller.integrity import CorruptCheckpoint, UnsafeCheckpoint

__all__ = ["MetadataUnpickler", "load_metadata", "loads_metadata"]


@functools.cache
def _layouts() -> dict[str, Any]:
    import torch

    return {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}


def _layout(name):
    """Stands in for ``torch.serialization._get_layout``: a name, one of torch's layouts."""
    layout = _layouts().get(name) if type(name) is str else None
    if layout is None:
        _refuse(f"it would look up {name!r}, which is not a torch layout")
    return layout


@functools.cache
def _tables() -> tuple[dict, dict, dict]:
    """(globals by exact (module, qualname), the classes that may be called, BUILD fields)."""
    import torch
    from torch.distributed.checkpoint import filesystem, metadata

    # Everything DCP's FileSystemWriter pickles into .metadata (torch 2.13), and nothing else.
    dataclass_types = (
        metadata.Metadata,
        metadata.TensorStorageMetadata,
        metadata.BytesStorageMetadata,
        metadata.ChunkStorageMetadata,
        metadata.TensorProperties,
        metadata.MetadataIndex,
        metadata.StorageMeta,
        filesystem._StorageInfo,
    )
    # torch.Size (shapes, offsets), the memory-format enum TensorProperties pickles, and the
    # path type StorageMeta.checkpoint_id has: built by calls, never BUILT into.
    other_types = (torch.Size, metadata._MEM_FORMAT_ENCODING, type(Path()))
    classes = {cls: cls for cls in dataclass_types + other_types}
    names = {(cls.__module__, cls.__qualname__): cls for cls in classes}
    # dtypes pickle as the global torch.<name>; they are values, not callables.
    for value in vars(torch).values():
        if isinstance(value, torch.dtype):
            names["torch", str(value).removeprefix("torch.")] = value
    names["torch.serialization", "_get_layout"] = _layout
    callables = {id(c): c for c in (*classes, _layout)}
    fields = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in dataclass_types}
    return names, callables, fields


def _refuse(what: str):
    raise UnsafeCheckpoint(what)


class _Dispatch(dict):
    def __missing__(self, code):
        raise pickle.UnpicklingError(f"invalid pickle opcode {bytes([code])!r}")


def _refused_opcode(name: str):
    def refuse(self):
        _refuse(f"it uses the pickle opcode {name}, which DCP's metadata never does")

    return refuse


def _allowed_callable(func) -> bool:
    return _tables()[1].get(id(func)) is func


def _load_reduce(self):
    args = self.stack.pop()
    func = self.stack[-1]
    if not _allowed_callable(func):
        _refuse(f"it would call {_describe(func)}")
    if type(args) is not tuple:
        _refuse(f"it would call {_describe(func)} with {type(args).__name__} arguments")
    self.stack[-1] = func(*args)


def _new(self, cls, args, kwargs):
    if not (_allowed_callable(cls) and isinstance(cls, type)):
        _refuse(f"it would create an instance of {_describe(cls)}")
    if type(args) is not tuple or type(kwargs) is not dict:
        _refuse(f"it would create {_describe(cls)} from {type(args).__name__} arguments")
    if not all(type(k) is str for k in kwargs):
        _refuse(f"it would create {_describe(cls)} with non-string keyword names")
    self.append(cls.__new__(cls, *args, **kwargs))


def _load_newobj(self):
    args = self.stack.pop()
    cls = self.stack.pop()
    _new(self, cls, args, {})


def _load_newobj_ex(self):
    kwargs = self.stack.pop()
    args = self.stack.pop()
    cls = self.stack.pop()
    _new(self, cls, args, kwargs)


def _load_build(self):
    state = self.stack.pop()
    inst = self.stack[-1]
    cls = type(inst)
    fields = _tables()[2].get(cls)
    if fields is None:
        if isinstance(inst, type):
            _refuse(f"it would set attributes on the class {_describe(inst)} itself")
        _refuse(f"it would set the state of {_describe(inst)}")
    if getattr(cls, "__setstate__", None) is not None:
        # TensorProperties: a 5-tuple of values that its own __setstate__ unpacks.
        if type(state) is not tuple:
            _refuse(f"it would set the state of a {cls.__qualname__} from {type(state).__name__}")
        inst.__setstate__(state)
        return
    if type(state) is not dict:
        _refuse(f"it would set the state of a {cls.__qualname__} from a {type(state).__name__}")
    if not all(type(k) is str and k in fields for k in state):
        _refuse(f"it would set {list(state)!r} on a {cls.__qualname__} (fields: {sorted(fields)})")
    inst.__dict__.update(state)


def _container_op(opcode: bytes, kind: type, depth: int | None):
    """Guard APPEND(S), SETITEM(S), ADDITEMS: the target must be exactly a ``kind``.

    The target sits ``depth`` places down the stack (APPEND, SETITEM), or right under the
    mark (``depth`` None: APPENDS, SETITEMS, ADDITEMS), where the reference code finds it.
    """
    original = pickle._Unpickler.dispatch[opcode[0]]

    def load(self):
        target = self.stack[-depth] if depth else self.metastack[-1][-1]
        if type(target) is not kind:
            _refuse(f"it would add items to {_describe(target)} (only to a {kind.__name__})")
        original(self)

    return load


def _describe(obj) -> str:
    if isinstance(obj, type) or callable(obj):
        module = getattr(obj, "__module__", None) or "?"
        return f"{module}.{getattr(obj, '__qualname__', repr(obj))}"
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def _dispatch() -> _Dispatch:
    table = _Dispatch(pickle._Unpickler.dispatch)
    for name in ("INST", "OBJ", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"):
        table[getattr(pickle, name)[0]] = _refused_opcode(name)
    table[pickle.REDUCE[0]] = _load_reduce
    table[pickle.NEWOBJ[0]] = _load_newobj
    table[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    table[pickle.BUILD[0]] = _load_build
    table[pickle.APPEND[0]] = _container_op(pickle.APPEND, list, 2)
    table[pickle.APPENDS[0]] = _container_op(pickle.APPENDS, list, None)
    table[pickle.SETITEM[0]] = _container_op(pickle.SETITEM, dict, 3)
    table[pickle.SETITEMS[0]] = _container_op(pickle.SETITEMS, dict, None)
    table[pickle.ADDITEMS[0]] = _container_op(pickle.ADDITEMS, set, None)
    return table


class MetadataUnpickler(pickle._Unpickler):
    """The reference unpickler, restricted to what DCP's metadata is made of (see module doc)."""

    dispatch = _dispatch()

    def find_class(self, module, name):
        found = _tables()[0].get((module, name))
        if found is None:
            _refuse(f"it would import {module}.{name}, which is not one of DCP's metadata types")
        return found

    def persistent_load(self, pid):
        _refuse("it refers to a persistent id")


def loads_metadata(data: bytes, *, where: str = "DCP metadata", directory: Path | None = None):
    """Unpickle ``data`` as DCP metadata and check its shape; see the module docstring.

    ``directory``: the checkpoint the metadata belongs to; every storage entry must name a
    plain file in it. Raises UnsafeCheckpoint or CorruptCheckpoint, naming ``where``.
    """
    try:
        # From memory: a length field of 2**62 then reads what there is, not 2**62 bytes.
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpoint as exc:
        raise UnsafeCheckpoint(_refusal(where, exc)) from None
    except Exception as exc:  # anything else a malformed stream raises: unreadable, not run
        raise CorruptCheckpoint(f"{where}: unreadable DCP .metadata ({exc!r})") from None
    try:
        _check(metadata, directory)
    except UnsafeCheckpoint as exc:
        raise UnsafeCheckpoint(_refusal(where, exc)) from None
    return metadata


def _refusal(where: str, exc: Exception) -> str:
    return (
        f"refusing {where}: {exc}. Loading a checkpoint never runs code; if this checkpoint was "
        "not written by this program, move it out of the directory (restore then takes the "
        "next older one)"
    )


def load_metadata(ckpt_dir: Path):
    """The checked :class:`Metadata` of the DCP checkpoint in ``ckpt_dir``."""
    ckpt_dir = Path(ckpt_dir)
    path = ckpt_dir / ".metadata"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CorruptCheckpoint(f"{ckpt_dir.name}: cannot read DCP .metadata ({exc})") from None
    return loads_metadata(data, where=f"{ckpt_dir.name}/.metadata", directory=ckpt_dir)


# -- the shape a loaded Metadata must have -------------------------------------------------
def _want(ok: bool, what: str) -> None:
    if not ok:
        _refuse(what)


def _is_int(v) -> bool:
    return type(v) is int and v >= 0


def _check_size(v, what: str) -> None:
    import torch

    _want(type(v) is torch.Size and all(type(n) is int for n in v), f"{what} is not a torch.Size")


def _check(md, directory: Path | None) -> None:
    import torch
    from torch.distributed.checkpoint import filesystem
    from torch.distributed.checkpoint import metadata as m

    _want(type(md) is m.Metadata, f"it holds {_describe(md)}, not a DCP Metadata")
    sdm = md.state_dict_metadata
    _want(type(sdm) is dict, "state_dict_metadata is not a dict")
    for fqn, entry in sdm.items():
        _want(type(fqn) is str, f"state_dict_metadata key {fqn!r} is not a string")
        if type(entry) is m.BytesStorageMetadata:
            _want(not vars(entry), f"{fqn}: BytesStorageMetadata with attributes")
            continue
        _want(type(entry) is m.TensorStorageMetadata, f"{fqn}: holds {_describe(entry)}")
        p = entry.properties
        _want(
            type(p) is m.TensorProperties
            and isinstance(p.dtype, torch.dtype)
            and isinstance(p.layout, torch.layout)
            and isinstance(p.memory_format, torch.memory_format)
            and type(p.requires_grad) is bool
            and type(p.pin_memory) is bool,
            f"{fqn}: malformed TensorProperties",
        )
        _check_size(entry.size, f"{fqn}: size")
        _want(type(entry.chunks) is list, f"{fqn}: chunks is not a list")
        for chunk in entry.chunks:
            _want(type(chunk) is m.ChunkStorageMetadata, f"{fqn}: a chunk is {_describe(chunk)}")
            _check_size(chunk.offsets, f"{fqn}: chunk offsets")
            _check_size(chunk.sizes, f"{fqn}: chunk sizes")
    planner = md.planner_data
    _want(planner is None or type(planner) is dict, "planner_data is not a dict")
    for fqn, path in (planner or {}).items():
        _want(
            type(fqn) is str
            and type(path) in (tuple, list)
            and all(type(k) in (str, int) for k in path),
            f"planner_data[{fqn!r}] is not a path of keys",
        )
    storage = md.storage_data
    _want(type(storage) is dict, "storage_data is not a dict")
    # Regular files only, not followed symlinks: the shards DCP wrote next to .metadata.
    files = None
    if directory is not None:
        with os.scandir(directory) as entries:
            files = {e.name for e in entries if e.is_file(follow_symlinks=False)}
    for index, info in storage.items():
        _want(
            type(index) is m.MetadataIndex
            and type(index.fqn) is str
            and (index.offset is None or type(index.offset) is torch.Size)
            and (index.index is None or type(index.index) is int),
            f"a storage_data key is {_describe(index)}, not a well-formed MetadataIndex",
        )
        _want(type(info) is filesystem._StorageInfo, f"{index.fqn}: storage is {_describe(info)}")
        name = info.relative_path
        _want(
            type(name) is str
            and name not in ("", ".", "..")
            and not any(c in name for c in "/\\\x00")
            and (files is None or name in files),
            f"{index.fqn}: {name!r} is not a file of this checkpoint",
        )
        _want(_is_int(info.offset) and _is_int(info.length), f"{index.fqn}: bad offset/length")
        # The controller's writer uses no transforms (compression and the like).
        _want(not info.transform_descriptors, f"{index.fqn}: storage transforms are not used")
    meta = md.storage_meta
    if meta is not None:
        _want(type(meta) is m.StorageMeta, f"storage_meta is {_describe(meta)}")
        _want(
            (
                meta.checkpoint_id is None
                or type(meta.checkpoint_id) is str
                or isinstance(meta.checkpoint_id, PurePath)
            )
            and all(v is None or type(v) is str for v in (meta.save_id, meta.load_id))
            and type(meta.modules) is list
            and all(type(v) is str for v in meta.modules),
            "malformed storage_meta",
        )
    _want(md.version is None or type(md.version) is str, "version is not a string")
