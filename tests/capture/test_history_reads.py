"""A forward that branches on what a tensor has been through (fixtures/histories.py) is run with each other
history of what it read, traced there where that history only sets state, or refused by name where no run can
try every value of it; the same reads choosing how one map is computed are certified."""

from __future__ import annotations

import json

import pytest

from conftest import qlint_json

SPEC = "fixtures/histories.py"
# factory: (verdict, max_q, what the failure or a finding says); None where the model is not analysed
EXPECTED = {
    "storage_offset": ("failed", None, "reads where a tensor lies in memory (its address, storage or offset)"),
    "not_contiguous": ("failed", None, "on non-contiguous inputs runs other ops than the model as analysed"),
    "expanded": ("failed", None, "on inputs expanded along the batch runs other ops"),
    "column_slice": ("failed", None, "on inputs sliced from wider rows (a chunk of a fused projection) runs other ops"),
    "two_of_three_frozen": ("supercritical", 2.0, "with every parameter but `u`'s frozen"),
    "hooked_without_gradients": ("uncertified", 1.0, "with gradient hooks on every parameter, with gradients off"),
    "grad_bound_early": ("supercritical", 2.0, "with gradients off (traced there: it runs other ops)"),
    "grad_held": ("supercritical", 2.0, "after a backward (every parameter holding a gradient)"),
    "partly_frozen": ("supercritical", 2.0, "with the parameters of `w` frozen alone"),
    "hooked": ("uncertified", 1.0, "with gradient hooks on every parameter"),
    "computed_input": ("failed", None, "on inputs computed with gradients (a block inside a network)"),
    "formatted": ("supercritical", 2.0, "with gradients off"),
    "printed": ("supercritical", 2.0, ""),  # symbolic_trace's Proxy prints no grad_fn: that path is traced
    "version_window": ("failed", None, "reads a tensor's version counter"),
    "torch_function_disabled": ("failed", None, "torch-function modes disabled"),
    "inference_bound_early": ("supercritical", 2.0, "in inference mode"),
    "anomaly_detection": ("supercritical", 2.0, "with anomaly detection"),
    "saved_tensors_offloaded": ("supercritical", 2.0, "with saved tensors offloaded"),
    "checkpointed_in_training": ("certified", 1.0, ""),
    "fused_without_gradients": ("certified", 1.0, ""),
    "hook_in_training": ("certified", 1.0, ""),
    "contiguous_when_needed": ("certified", 1.0, "on inputs sliced from wider rows"),  # the layout histories ran
    "device_and_shape_reads": ("certified", 1.0, ""),
    # review r14: module state, a Python attribute on the input, a transform (compile, vmap)
    "forward_hooked": ("failed", None, "reads the hooks registered on a module at"),
    "submodule_in_eval": ("supercritical", 2.0, "with the mode of `u` flipped (the rest as analysed) (traced there"),
    "attribute_on_the_input": ("failed", None, "reads a Python attribute of a tensor it was given"),
    "compiled_only": ("supercritical", 2.0, "as torch.compile runs it"),
    "vmapped": ("failed", None, "asks whether it runs under a functorch transform (vmap, grad, jacrev)"),
    "checked_unless_compiled": ("certified", 1.0, "\"tracer\": \"export\""),  # export traces as compile runs it
    "fused_when_compiled": ("certified", 1.0, "as torch.compile runs it"),
    "head_follows_the_body": ("certified", 1.0, "with the mode of `a` flipped (the rest as analysed) (traced there"),
    "parameter_attribute": ("certified", 1.0, ""),
    "frozen_batchnorm_square": ("supercritical", 2.0, "with its BatchNorm layers in eval mode while it trains"),
    "frozen_batchnorm_relu": ("certified", 1.0, "with its BatchNorm layers in eval mode while it trains"),
    "torch_builtin_query": ("uncertified", 1.0, "the value of `torch._C._cuda_getDeviceCount()`"),
}
# reads of the platform no mechanism sees yet: each must not be certified, a known failure until one does
OPEN = {
    "device_type_branch": "`x.device.type` is an attribute of a device object, which no torch-function mode sees",
}


@pytest.fixture(scope="module")
def report() -> dict[str, dict]:
    names = [*EXPECTED, *OPEN]
    return dict(zip(names, qlint_json([f"{SPEC}:{name}" for name in names])))


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_history_read_is_checked_in_the_history_it_names(report, name):
    verdict, q, says = EXPECTED[name]
    model = report[name]
    assert (model["verdict"], model["max_q"]) == (verdict, q), json.dumps(model)[:1500]
    assert says in json.dumps(model), json.dumps(model)[:1500]


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(reason=why, strict=True))
                                  for name, why in OPEN.items()])
def test_an_open_hole_is_not_certified(report, name):
    assert report[name]["verdict"] != "certified", json.dumps(report[name])[:800]
