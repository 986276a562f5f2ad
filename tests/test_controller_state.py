"""Complete state: what is captured comes back exactly, through the on-disk split and staging."""

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.controller.state import (
    UnsupportedState,
    capture_state,
    flatten,
    restore_state,
    stage,
    unflatten,
)


def same(a, b) -> bool:
    """Structural equality with torch.equal on tensors and exact types for containers."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if type(a) is not type(b) and not (isinstance(a, dict) and isinstance(b, dict)):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


tensors = st.sampled_from(
    [torch.float32, torch.float64, torch.int64, torch.bool, torch.uint8]
).flatmap(
    lambda dtype: st.lists(st.integers(0, 5), min_size=0, max_size=3).map(
        lambda shape: (torch.arange(int(np.prod(shape))) % 3).reshape(shape).to(dtype)
    )
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | tensors
)
trees = st.recursive(
    leaves,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.integers(-3, 3), kids, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(trees)
def test_flatten_then_unflatten_gives_back_the_same_nested_state(tree):
    tensors_, meta = flatten({"root": tree})
    meta = json.loads(json.dumps(meta))  # what the disk sees
    assert same(unflatten(tensors_, meta), {"root": tree})


def test_numpy_values_and_dunder_keys_survive_the_json_side():
    state = {
        "__weird__": 1,
        "arr": np.arange(5, dtype=np.uint32),
        "scalar": np.float32(0.1),
        "rng": np.random.default_rng(3).bit_generator.state,
    }
    tensors_, meta = flatten(state)
    back = unflatten(tensors_, meta)
    assert same(back, state)


def test_tied_weights_are_stored_once_and_both_names_restore():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    tensors_, meta = flatten(model.state_dict())
    assert len(tensors_) == 1
    back = unflatten(tensors_, meta)
    assert torch.equal(back["emb.weight"], emb.weight) and torch.equal(
        back["head.weight"], emb.weight
    )


def test_an_object_that_would_need_pickle_is_refused_with_its_path():
    with pytest.raises(UnsupportedState, match=r"state\['a'\]\[0\]"):
        flatten({"a": [object()]})


def test_restored_rng_states_replay_the_same_draws_everywhere():
    model = torch.nn.Linear(3, 3)
    state, _ = stage(capture_state(step=7, model=model))

    def draws():
        return (
            random.random(),
            np.random.random(),  # noqa: NPY002 - the global generator is what is captured
            torch.rand(3),
        )

    first = draws()
    assert restore_state(state, model=model) == 7
    assert same(draws(), first)


def test_a_staged_snapshot_does_not_follow_later_training():
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    snap, _ = stage(capture_state(step=1, model=model, optimizer=opt))
    before = snap["model"]["weight"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    opt.state[model.weight]["momentum_buffer"].add_(1.0)
    assert torch.equal(snap["model"]["weight"], before)
    assert not torch.equal(
        snap["optimizer"]["state"][0]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"]
    )


def test_a_run_with_a_scaler_but_a_checkpoint_without_one_is_an_error():
    model = torch.nn.Linear(2, 2)
    state = capture_state(step=1, model=model)
    with pytest.raises(KeyError, match="scaler"):
        restore_state(state, model=model, scaler=torch.amp.GradScaler("cpu"))
