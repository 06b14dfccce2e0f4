"""What a forward reads from the process around it (qlint.capture.process_state): who made the read decides
whether it is the model's condition (its own code), a library's switch (an installed package) or
torch's own business (a kernel library torch loads reads its configuration)."""

from __future__ import annotations

import os
from pathlib import Path

import click
import pytest
import torch
from torch import nn

from qlint.capture.eager_record import record
from qlint.capture.process_state import answering, environment_set, own_caches_apart


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


INSTALLED = click.__file__  # a file of an installed package


def test_a_read_in_an_installed_package_is_the_librarys_configuration():
    assert _conditions(_compiled(INSTALLED)) == []


def test_a_path_that_only_looks_installed_is_the_models_own():
    """A project folder named site-packages, or code compiled under an installed-looking name that is no file."""
    (condition,) = _conditions(_compiled("/venv/lib/python3.11/site-packages/lib/switch.py"))
    assert condition.name == "QLINT_TEST_SWITCH"


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


def _facts_read(file: str, expression: str) -> dict[str, str]:
    namespace: dict = {}
    exec(compile(f"def read(x):\n    return {expression}\n", file, "exec"), namespace)
    return record(_DtypeReader(namespace["read"]), (torch.randn(1, 2),)).facts_read


def _reads_dtype(file: str, expression: str) -> bool:
    return "dtype" in _facts_read(file, expression)


def test_a_dtype_read_by_the_models_own_code_is_seen_in_each_spelling():
    """A branch on float16 needs a reduced-precision copy of the model checked (graph_check), only then."""
    own = "/home/me/project/model.py"
    assert _reads_dtype(own, "x.dtype is None")
    assert _reads_dtype(own, "x.type()") and _reads_dtype(own, "x.element_size()")
    assert not _reads_dtype(own, "x.shape[0]")
    assert not _reads_dtype(INSTALLED, "x.dtype")  # a library's own upcast


@pytest.mark.parametrize("expression, family", [
    ("x.requires_grad", "autograd"), ("(x * 1).grad_fn is None", "autograd"), ("x.is_leaf", "autograd"),
    ("x.grad", "autograd"), ("x._version > 3", "version"), ("x.data_ptr()", "address"),
    ("x.untyped_storage()", "address"), ("x._cdata", "address"), ("x.storage_offset()", "address"),
    ("x.is_contiguous()", "layout"), ("0 in x.stride()", "layout"), ("x._is_view()", "layout"),
    ("x.is_inference()", "inference"), ("x._post_accumulate_grad_hooks", "autograd"),
])
def test_a_fact_about_a_tensors_history_is_read_with_its_line(expression, family):
    """What a tensor has been through (graph_check._other_histories runs the model with each other history)."""
    own = "/home/me/project/model.py"
    assert set(_facts_read(own, expression)) == {family}
    assert _facts_read(own, expression)[family].startswith(f"{own}:2 ")
    assert set(_facts_read(INSTALLED, expression)) == {family}  # a library's model branches as the model's own
    assert _facts_read(str(Path(torch.__file__).parent / "nn" / "x.py"), expression) == {}  # torch's own business


def test_a_custom_functions_needs_input_grad_is_a_read_of_autograd_state():
    """Autograd fills ``ctx.needs_input_grad`` in C from each input's requires_grad (review r17): no tensor attribute
    is read, yet a forward may branch on it; torch's own Functions reading it are torch's business."""
    namespace: dict = {}
    exec(compile("import torch\nclass Scaled(torch.autograd.Function):\n    @staticmethod\n"
                 "    def forward(ctx, x):\n        return x * 2 if ctx.needs_input_grad[0] else x * 3\n"
                 "    @staticmethod\n    def backward(ctx, grad):\n        return grad * 2\n"
                 "def read(x):\n    return Scaled.apply(x)\n", "/home/me/project/model.py", "exec"), namespace)
    facts = record(_DtypeReader(namespace["read"]), (torch.randn(1, 2),)).facts_read
    assert facts.get("autograd", "").startswith("/home/me/project/model.py:5 "), facts
    assert "needs_input_grad" not in vars(torch.autograd.function.BackwardCFunction)  # put back


def test_values_and_shapes_are_no_history():
    assert _facts_read("/home/me/project/model.py", "(x.shape[0], x.sum(), x.ndim, x.device, x.T, x.numel())") == {}


def test_a_fact_read_through_the_standard_library_or_a_tensors_text_is_the_callers():
    own = "/home/me/project/model.py"
    assert set(_facts_read(own, "__import__('string').Formatter().format('{0.requires_grad}', x)")) == {"autograd"}
    assert set(_facts_read(own, "repr(x)")) == {"autograd", "dtype"}


def test_a_read_with_torch_function_modes_disabled_is_noted():
    own = "/home/me/project/model.py"
    namespace: dict = {}
    exec(compile("import torch\ndef read(x):\n    with torch._C.DisableTorchFunction():\n        return x.dtype\n",
                 own, "exec"), namespace)
    facts = record(_DtypeReader(namespace["read"]), (torch.randn(1, 2),)).facts_read
    assert set(facts) == {"hidden"} and facts["hidden"].startswith(f"{own}:3 ")  # the dtype read inside is unseen


SPELLINGS = {  # a read of process state in the model's own code: the condition's kind
    "default argument": ("import threading\nFLAGS = threading.local()\n"
                         "def switch(flags=FLAGS):\n    return getattr(flags, 'on', False)\n", "thread state"),
    "class attribute": ("import threading\nclass State:\n    tls = threading.local()\n"
                        "def switch():\n    return getattr(State.tls, 'on', False)\n", "thread state"),
    "thread identity": ("import threading\ndef switch():\n    return threading.get_ident() in ()\n", "thread state"),
    "os.environ read directly": ("import os\ndef switch():\n    return os.environ._data.get(b'X')\n", "environment"),
    "ctypes": ("import ctypes\nLIBC = ctypes.CDLL(None)\ndef switch():\n    return LIBC.getpid()\n", "native code"),
    "command line": ("import sys\ndef switch():\n    return '--fast' in sys.argv\n", "command line"),
    "loaded modules": ("import sys\ndef switch():\n    return 'qlint' in sys.modules\n", "loaded modules"),
    "python random": ("import random\ndef switch():\n    return random.random() < 1e-6\n", "random"),
    "clock_gettime": ("import time\ndef switch():\n    return time.clock_gettime(time.CLOCK_MONOTONIC) < 0\n", "clock"),
    "traceback frames": ("def switch():\n    try:\n        raise ValueError\n    except ValueError as error:\n"
                         "        return error.__traceback__.tb_frame.f_back.f_code.co_name\n", "call stack"),
    "thread count": ("import torch\ndef switch():\n    return torch.get_num_threads() > 1\n", "torch setting"),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_each_spelling_of_process_state_is_a_condition(spelling):
    source, kind = SPELLINGS[spelling]
    namespace: dict = {}
    exec(compile(source, "/home/me/project/switches.py", "exec"), namespace)
    assert kind in {condition.kind for condition in _conditions(namespace["switch"])}


QUERIES = {  # a query of the process (no argument, or of an object): a condition of kind "process", its answer named
    "CUDA": ("import torch\ndef switch():\n    return torch.cuda.is_available()\n", "torch.cuda.is_available"),
    "process group": ("import torch.distributed as dist\ndef switch():\n    return dist.is_initialized()\n",
                      "is_initialized"),
    "logger level": ("import logging\ndef switch():\n    return logging.getLogger('m').isEnabledFor(10)\n",
                     "Logger.isEnabledFor"),
    "cores": ("import os\ndef switch():\n    return os.cpu_count() > 256\n", "cpu_count()"),
    "threads": ("import threading\ndef switch():\n    return threading.active_count() > 4\n", "threading.active_count"),
    "dispatch mode": ("from torch.utils._python_dispatch import _get_current_dispatch_mode\ndef switch():\n"
                      "    return _get_current_dispatch_mode() is None\n", "mode, qlint's own"),
}


@pytest.mark.parametrize("spelling", list(QUERIES))
def test_a_query_of_the_platform_is_a_condition_naming_its_answer(spelling):
    """Whatever the platform fact (review r15): a call outside the model's code that is asked nothing or asks an
    object, and answers a plain value, reads the process."""
    source, name = QUERIES[spelling]
    namespace: dict = {}
    exec(compile(source, "/home/me/project/switches.py", "exec"), namespace)
    found = [c for c in _conditions(namespace["switch"]) if c.kind == "process"]
    assert len(found) == 1 and name in found[0].what and found[0].line == 3, found


PLATFORM_ATTRIBUTES = {  # a plain value read off the platform with no call (review r17): a condition naming it
    "sys.platform": ("import sys\ndef switch():\n    return sys.platform == 'darwin'\n", "`sys.platform` ("),
    "a module's module": ("import torch\ndef switch():\n    return torch.version.hip is not None\n",
                          "`torch.version.hip` (None here)"),
    "a backend flag": ("import torch\ndef switch():\n    return torch.backends.cudnn.benchmark\n",
                       "`torch.backends.cudnn.benchmark` (False here)"),
    "a record": ("import sys\ndef switch():\n    return bool(sys.flags.optimize)\n", "`sys.flags.optimize` (0 here)"),
    "an object": ("import logging\nLOG = logging.getLogger('m')\ndef switch():\n    return LOG.level > 0\n",
                  "`LOG.level` (0 here)"),
}


@pytest.mark.parametrize("spelling", list(PLATFORM_ATTRIBUTES))
def test_a_plain_value_read_off_the_platform_is_a_condition(spelling):
    source, what = PLATFORM_ATTRIBUTES[spelling]
    namespace: dict = {}
    exec(compile(source, "/home/me/project/switches.py", "exec"), namespace)
    found = [c.what for c in _conditions(namespace["switch"]) if c.kind == "platform"]
    assert len(found) == 1 and found[0].startswith(what), found


def test_pure_computations_and_checked_modes_are_no_condition():
    """A function of plain arguments (an installed helper), the standard library's pure modules, and the modes the
    graph check enters (is_grad_enabled, is_compiling) read nothing it cannot vary."""
    helper: dict = {}
    exec(compile("def divisible(n, k):\n    return n % k == 0\n", INSTALLED, "exec"), helper)
    namespace: dict = {"divisible": helper["divisible"]}
    exec(compile("import math, torch\ndef switch():\n    return (divisible(64, 8), math.sqrt(4), math.pi, "
                 "torch.float32.is_floating_point, torch.finfo(torch.float32).max, torch.nn.functional.gelu, "
                 "torch.is_grad_enabled(), torch.compiler.is_compiling(), len([1]))\n",
                 "/home/me/project/switches.py", "exec"), namespace)
    assert _conditions(namespace["switch"]) == []


def test_a_two_valued_query_is_answered_both_ways_and_put_back():
    """Its other answer is tried (capture/pipeline traces the model there where it changes the forward)."""
    namespace: dict = {}
    exec(compile("import torch\ndef switch():\n    return torch.cuda.is_available()\n",
                 "/home/me/project/switches.py", "exec"), namespace)
    recorded = record(_Reads(namespace["switch"]), (torch.randn(1, 2),))
    [(function, answer)] = recorded.two_valued.values()
    assert function is torch.cuda.is_available and answer is torch.cuda.is_available()
    with answering(function, not answer):
        assert torch.cuda.is_available() is (not answer)
    assert torch.cuda.is_available() is answer


def test_the_models_memoised_query_is_asked_again_and_the_users_caches_are_kept(tmp_path, monkeypatch):
    """While qlint captures, the model's own ``functools`` caches are empty ones of the same kind (a memoised answer
    is asked again in each watched forward); after it, the user's caches hold what they held (a test's or a
    notebook's memoised results are not qlint's to drop)."""
    (tmp_path / "memo.py").write_text(
        "import functools\nimport torch\n\n\n@functools.cache\ndef fast():\n    return torch.cuda.is_available()\n\n\n"
        "class Holder:\n    @staticmethod\n    @functools.lru_cache(maxsize=4)\n    def kept(n):\n        return n * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import memo

    memo.fast(), memo.Holder.kept(3)
    user_caches = (memo.fast, vars(memo.Holder)["kept"])
    model = _Reads(memo.fast)  # holding the function too
    with own_caches_apart(model):
        assert memo.fast is not user_caches[0] and memo.fast.cache_info().currsize == 0
        assert memo.Holder.kept(3) == 6 and memo.Holder.kept.cache_parameters()["maxsize"] == 4
        assert model.switch is memo.fast
        recorded = record(model, (torch.randn(1, 2),))
    assert model.switch is user_caches[0]
    assert [what for what, _ in [(c.what, c) for c in recorded.conditions]] == [
        f"the value of `torch.cuda.is_available` ({torch.cuda.is_available()} here)"]
    assert (memo.fast, vars(memo.Holder)["kept"]) == user_caches
    assert memo.fast.cache_info().currsize == 1 and memo.Holder.kept.cache_info().currsize == 1


class _Device(nn.Module):
    def __init__(self, read):
        super().__init__()
        self.read, self.f = read, nn.Linear(2, 2)

    def forward(self, x):
        return x + self.f(x) * (2 if self.read(x) else 1)


def test_the_device_and_a_random_draw_read_into_python_are_conditions():
    """No run here puts a batch on a GPU or forces a draw: the certificate holds for the CPU and the draws made."""
    for expression, kind in (("x.is_cuda", "device"), ("x.get_device() >= 0", "device"),
                             ("bool(torch.rand(()) < 0.5)", "random")):
        namespace: dict = {}
        exec(compile(f"import torch\ndef read(x):\n    return {expression}\n", "/home/me/project/m.py", "exec"),
             namespace)
        conditions = record(_Device(namespace["read"]), (torch.randn(1, 2),)).conditions
        assert [(c.kind, c.line) for c in conditions] == [(kind, 3)], (expression, conditions)
    # the device passed along to a factory (the commonest read) is no branch
    assert record(_Device(lambda x: torch.zeros((), device=x.device) > 1), (torch.randn(1, 2),)).conditions == []
