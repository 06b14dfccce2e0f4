"""What a forward's code reads off its modules (qlint.capture.module_state): hook registries and training flags,
read by the model's code and not by torch's, are noted with the module that reads; the registries and flags are
put back as they were, hooks registered meanwhile kept."""

from __future__ import annotations

import torch
from torch import nn

from qlint.capture.histories import mode_histories
from qlint.capture.module_state import cross_reads, flag_reads, hook_reads


class _Pair(nn.Module):
    def __init__(self, read=lambda m: None):
        super().__init__()
        self.read, self.a, self.b = read, nn.Linear(2, 2), nn.Dropout(0.1)

    def forward(self, x):
        self.read(self)
        return self.b(self.a(x))


def test_a_hook_registry_read_by_the_models_code_is_noted_and_torchs_is_not():
    quiet, asking = _Pair(), _Pair(lambda m: len(m.a._forward_hooks))
    handle = quiet.a.register_forward_hook(lambda *args: None)  # torch's dispatch of it reads the registry
    for model, expected in ((quiet, set()), (asking, {"hooks"})):
        facts: dict[str, str] = {}
        with hook_reads(model, facts):
            model(torch.randn(1, 2))
        assert set(facts) == expected
    assert list(quiet.a._forward_hooks) == [handle.id]
    assert type(quiet.a._forward_hooks).__name__ == "OrderedDict"  # the registry itself put back


def test_a_hook_registered_during_the_forward_is_kept():
    model = _Pair(lambda m: m.a.register_forward_pre_hook(lambda *args: None))
    with hook_reads(model, {}):
        model(torch.randn(1, 2))
    assert len(model.a._forward_pre_hooks) == 1


def test_flags_are_noted_by_reader_and_a_read_of_anothers_is_a_cross_read():
    model = _Pair(lambda m: m.training and m.a.training).train()
    groups: dict[str, dict[str, str]] = {}
    with flag_reads(model, groups):
        model(torch.randn(1, 2))
    assert {reader: set(owners) for reader, owners in groups.items()} == {"": {"", "a"}}  # Dropout's read is torch's
    assert set(cross_reads(groups)) == {""}
    assert "training" not in vars(nn.Linear) and model.a.training is True  # the class is left as it was
    own = {"a": {"a": "line"}}
    assert cross_reads(own) == {}


def test_a_flag_read_from_a_modules_dict_is_noted_and_the_dict_put_back_with_what_the_forward_set():
    def read(m):
        m.b.__dict__["note"] = 1  # a write through the watched dict is kept
        return not m.a.__dict__["training"]

    model = _Pair(read).train()
    original = model.a.__dict__
    groups: dict[str, dict[str, str]] = {}
    with flag_reads(model, groups):
        model(torch.randn(1, 2))
    assert {reader: set(owners) for reader, owners in groups.items()} == {"": {"a"}}
    assert model.a.__dict__ is original and type(original) is dict and model.b.note == 1


def test_a_modules_dict_held_by_another_is_its_holders_read_and_is_not_swapped():
    model = _Pair(lambda m: m.held["training"]).train()
    model.held = model.a.__dict__  # a reference taken at build time: reads through it pass every watch
    groups: dict[str, dict[str, str]] = {}
    with flag_reads(model, groups):
        assert model.a.__dict__ is model.held  # left in place: a swapped copy would split reads from writes
        model(torch.randn(1, 2))
    assert groups == {"": {"a": "`model.held` (holding the __dict__ of `a`)"}}
    assert set(cross_reads(groups)) == {""}


def test_a_hook_registry_held_in_a_list_is_a_read():
    model = _Pair()
    model.observed = [model.a._forward_hooks]
    facts: dict[str, str] = {}
    with hook_reads(model, facts):
        model(torch.randn(1, 2))
    assert facts == {"hooks": "`model.observed` (holding `_forward_hooks`)"}


def test_every_combination_of_the_flags_read_together_is_tried_and_put_back():
    model = _Pair().train()
    histories = mode_histories(model, [["", "a"]])
    assert [what for what, _, _ in histories] == [
        "with the mode of `_Pair` flipped (the rest as analysed)", "with the mode of `a` flipped (the rest as analysed)",
        "with the mode of `_Pair`, `a` flipped (the rest as analysed)"]
    _, both, same_inputs = histories[-1]
    with both((1,)) as given:
        assert given == (1,) and not model.training and not model.a.training and model.b.training
    assert model.training and model.a.training and same_inputs
