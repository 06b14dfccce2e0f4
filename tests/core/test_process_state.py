"""What a forward reads from the process around it (qlint.core.process_state): who made the read decides
whether it is the model's condition (its own code), a library's switch (an installed package) or
torch's own business (a kernel library torch loads reads its configuration)."""

from __future__ import annotations

import os

import torch
from torch import nn

from qlint.core.eager_record import record
from qlint.core.process_state import environment_set


def _compiled(file: str):
    """A function reading QLINT_TEST_SWITCH whose code says it lives in ``file``."""
    namespace = {"os": os}
    exec(compile("def switch():\n    return os.environ.get('QLINT_TEST_SWITCH')\n", file, "exec"), namespace)
    return namespace["switch"]


class _Reads(nn.Module):
    def __init__(self, switch):
        super().__init__()
        self.switch, self.f = switch, nn.Linear(2, 2)

    def forward(self, x):
        self.switch()
        return x + self.f(x)


def _conditions(switch):
    return record(_Reads(switch), (torch.randn(1, 2),)).conditions


def test_a_read_in_the_models_own_code_is_its_condition():
    (condition,) = _conditions(_compiled("/home/me/project/model.py"))
    assert (condition.kind, condition.name, condition.line) == ("environment", "QLINT_TEST_SWITCH", 2)


def test_a_read_in_an_installed_package_is_the_librarys_configuration():
    assert _conditions(_compiled("/venv/lib/python3.11/site-packages/lib/switch.py")) == []


def _checkpointed(switch):
    class Through(nn.Module):
        def forward(self, x):
            return torch.utils.checkpoint.checkpoint(lambda y: y + float(switch() is None), x, use_reentrant=False)

    return record(Through(), (torch.randn(1, 2),)).conditions


def test_the_users_code_is_the_models_whoever_calls_it():
    """torch.utils.checkpoint calls the block's function: torch's frames lie between it and the module call."""
    (condition,) = _checkpointed(_compiled("/home/me/project/model.py"))
    assert condition.name == "QLINT_TEST_SWITCH"


def test_a_variable_is_set_for_the_block_only():
    before = os.environ.get("QLINT_TEST_SWITCH")
    with environment_set("QLINT_TEST_SWITCH", "1"):
        assert os.environ["QLINT_TEST_SWITCH"] == "1"
    assert os.environ.get("QLINT_TEST_SWITCH") == before


class _DtypeReader(nn.Module):
    def __init__(self, read):
        super().__init__()
        self.read, self.f = read, nn.Linear(2, 2)

    def forward(self, x):
        self.read(x)
        return x + self.f(x)


def _reads_dtype(file: str, expression: str) -> bool:
    namespace: dict = {}
    exec(compile(f"def read(x):\n    return {expression}\n", file, "exec"), namespace)
    return record(_DtypeReader(namespace["read"]), (torch.randn(1, 2),)).reads_dtype


def test_a_dtype_read_by_the_models_own_code_is_seen_in_each_spelling():
    """A branch on float16 needs a reduced-precision copy of the model checked (graph_check), only then."""
    own = "/home/me/project/model.py"
    assert _reads_dtype(own, "x.dtype is None")
    assert _reads_dtype(own, "x.type()") and _reads_dtype(own, "x.element_size()")
    assert not _reads_dtype(own, "x.shape[0]")
    assert not _reads_dtype("/venv/lib/python3.11/site-packages/lib/read.py", "x.dtype")  # a library's own upcast
