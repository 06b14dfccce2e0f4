"""The registry checks itself: every entry resolves, names real arguments, and its transfer
obeys the laws every transfer must, on every ATen overload of every op it claims.

The laws, for each overload called with every tensor argument input-dependent:

* the transfer runs (an error it raises is reported as unknown, never a crash), and its result
  has the op's output structure (one Growth per tensor the schema returns);
* a dependent argument it did not read makes the result unknown (``Call.unread``);
* raising one argument's exponent never lowers the result's (monotone: Theorem 9's
  operations all are), and an unknown argument leaves the result unknown unless the
  entry reads it as a selector (indices, masks) or for its shape only;
* a numeric parameter moved off its default (``eps=-1``, ``p=0.5``, ``beta=-1``,
  ``min=inf``) is either one the entry declares harmless or yields a result the rule
  computed with it, otherwise unknown.
"""

from __future__ import annotations

import ast
import inspect
import math
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import torch
import torch.fx as fx

from qlint.core.domain import Growth
from qlint.core.graph import annotate, facts
from qlint.core.ops import NEUTRAL, Call
from qlint.growth.propagate import run_transfer, structure_mismatch
from qlint.core.toml import tomllib
from qlint.registry import default, entries, resolve, rules_dir, spellings, transfers

REGISTRY = default()


def test_every_target_resolves():
    assert REGISTRY.unresolved == []


def test_library_targets_resolve_and_are_found_by_their_own_name():
    """A dotted-path target outside torch (deferred when its library is not imported yet) must
    exist and be reachable by its object's __module__.__qualname__."""
    library = [(t, p) for p in REGISTRY.primitives for t in p.targets
               if not t.startswith(("aten.", "torch.", "method:", "module:torch."))
               and t.removeprefix("module:").split(".")[0] not in sys.stdlib_module_names]
    assert any(t.startswith("torchvision.") for t, _ in library)
    for target, primitive in library:
        kind, obj = resolve(target)
        assert f"{'module:' if kind == 'module' else ''}{obj.__module__}.{obj.__qualname__}" == target
        assert REGISTRY.lookup("call_module" if kind == "module" else "call_function", obj) is primitive, target


def test_building_the_registry_does_not_import_torchvision():
    code = ("import sys; from qlint.registry import default; r = default(); assert 'torchvision' not in sys.modules; "
            "import torchvision; from torchvision.ops import stochastic_depth as sd; "
            "print(len(r.deferred), r.lookup('call_function', sd).id)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    count, found = done.stdout.split()
    stochastic_depth = resolve("torchvision.ops.stochastic_depth.stochastic_depth")[1]
    assert int(count) > 0 and found == REGISTRY.lookup("call_function", stochastic_depth).id


def test_a_look_alike_of_a_deferred_target_is_unknown():
    def stochastic_depth(input, p, mode, training=True):
        return input * 1e3

    stochastic_depth.__module__ = "torchvision.ops.stochastic_depth"
    assert REGISTRY.lookup("call_function", stochastic_depth) is None


def test_every_op_has_a_spelling_in_this_torch():
    missing = [(table["id"], op) for table in entries() for op in table.get("ops", [])
               if not any(resolve(t) for t in spellings(op) if not t.startswith("method:"))
               and not hasattr(torch.Tensor, op)]
    assert missing == []


def _aten_packets() -> Iterator[tuple[str, Any]]:
    for kind, name in REGISTRY.keys():
        if kind == "op" and name.startswith("aten::"):
            packet = _packet(name)
            yield REGISTRY.lookup("call_function", packet).id, packet


def _packet(name: str) -> Any:
    namespace, _, op = name.partition("::")
    return getattr(getattr(torch.ops, namespace), op, None)


def _argument_names(primitive_id: str) -> set[str]:
    """Every argument name any spelling of the entry's ops takes (schemas and signatures)."""
    names: set[str] = {"input", "self"}
    primitive = REGISTRY.by_id[primitive_id]
    for target in primitive.targets:
        key = resolve(target)
        if key is None:
            continue
        obj = _packet(key[1]) if key[0] == "op" else key[1]
        if obj is None:
            continue  # a library's custom op that is not loaded in this process
        if isinstance(obj, torch._ops.OpOverloadPacket):
            for overload in obj.overloads():
                names |= {a.name for a in getattr(obj, overload)._schema.arguments}
        elif key[0] == "module":
            names |= set(inspect.signature(obj.forward).parameters) | set(inspect.signature(obj.__init__).parameters)
        else:
            try:
                names |= set(inspect.signature(obj).parameters)
            except (TypeError, ValueError):
                pass
    return names | {alias for alias, _ in primitive.aliases} | {name for _, name in primitive.aliases}


@pytest.mark.parametrize("table", entries(), ids=lambda t: t["id"])
def test_declared_argument_names_exist(table):
    """A typo in ``params`` / ``meta_args`` would silently accept nothing (or the wrong thing)."""
    if not table.get("ops") and not table.get("targets") and not table.get("modules"):
        pytest.skip("no targets")
    declared = set(table.get("params", [])) - {"*"} | set(table.get("meta_args", []))
    assert declared <= _argument_names(table["id"]), sorted(declared - _argument_names(table["id"]))


# --- the transfer laws on every overload ----------------------------------------------------------

_REQUIRED = {"int": 1, "SymInt": 1, "float": 0.5, "bool": False, "List[int]": [1], "str": "none", "number": 1.0,
             "ScalarType": torch.float32}
_MOVED = {"float": (-1.0, 0.5, math.inf, 0.0), "int": (-1, 0, 3), "bool": (True, False),
          "number": (-1.0, math.inf, 0.0)}


def _kind(argument: Any) -> str:
    kind = str(argument.type)
    return kind[len("Optional[") : -1] if kind.startswith("Optional[") and kind != "Optional[Tensor]" else kind


def _call(overload: Any) -> Optional[tuple[fx.GraphModule, fx.Node, list[fx.Node], dict[str, tuple[str, Any]]]]:
    """One graph calling ``overload`` with a placeholder for every tensor; None when unbuildable."""
    schema = overload._schema
    if schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return None
    graph = fx.Graph()
    tensors: list[fx.Node] = []
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    numeric: dict[str, tuple[str, Any]] = {}

    def placeholder() -> fx.Node:
        node = graph.placeholder(f"t{len(tensors)}")
        tensors.append(node)
        return node

    for a in schema.arguments:
        kind, optional = _kind(a), str(a.type).startswith("Optional[")
        if kind in ("Tensor", "Optional[Tensor]"):
            value: Any = placeholder()
        elif kind in ("List[Tensor]", "List[Optional[Tensor]]"):
            value = [placeholder(), placeholder()]
        elif a.has_default_value() or optional:
            if kind in _MOVED:
                numeric[a.name] = (kind, a.default_value if a.has_default_value() else None)
            if a.has_default_value():
                continue
            value = None
        elif kind in _REQUIRED:
            value = _REQUIRED[kind]
            if kind in _MOVED:
                numeric[a.name] = (kind, value)
        else:
            return None
        (kwargs.__setitem__(a.name, value) if a.kwarg_only else args.append(value))
    if not tensors:
        return None
    node = graph.call_function(overload, tuple(args), kwargs)
    graph.output(node)
    module = fx.GraphModule(torch.nn.Module(), graph)
    annotate(module, REGISTRY)
    node = next(n for n in module.graph.nodes if n.op == "call_function")
    return module, node, [n for n in module.graph.nodes if n.op == "placeholder"], numeric


def _overloads() -> Iterator[tuple[str, Any]]:
    for primitive_id, packet in _aten_packets():
        if REGISTRY.by_id[primitive_id].unbounded:
            continue
        for name in packet.overloads():
            yield f"{primitive_id}:{packet._qualified_op_name}.{name}", getattr(packet, name)


OVERLOADS = list(_overloads())
# out= variants mutate: no transfer
CASES = [(label, overload) for label, overload in OVERLOADS if _call(overload) is not None]


_ABSENT = object()


def _q(value: Any) -> Optional[float]:
    growths = [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, Growth)]
    if any(g.q is None for g in growths):
        return None
    return max((g.q for g in growths), default=0.0)


def _at_most(a: Optional[float], b: Optional[float]) -> bool:
    rank = lambda q: math.inf if q is None else q  # noqa: E731  unknown ranks with inf: never below a bound
    return rank(a) <= rank(b)


def test_the_laws_reach_every_entry_with_an_aten_op():
    reached = {label.split(":")[0] for label, _ in CASES}
    assert reached == {primitive_id for primitive_id, _ in _aten_packets()
                       if not REGISTRY.by_id[primitive_id].unbounded}
    assert len(CASES) > 300, len(CASES)


@pytest.mark.parametrize("label, overload", CASES, ids=[label for label, _ in CASES])
def test_transfer_laws(label, overload):
    module, node, placeholders, numeric = _call(overload)
    info = facts(node)
    assert info.primitive is not None, label
    base = {p: Growth(1.0) for p in placeholders}
    arguments = {name: fx.node.map_arg(v, lambda n: base[n]) for name, v in info.bound.arguments.items()}
    try:
        raw = info.primitive.transfer(Call(node, arguments, info.bound.defaults), info.primitive)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError):
        raw = None
    if raw is not None:
        mismatch = structure_mismatch(raw, node, info.primitive)
        assert mismatch is None, f"{label}: {mismatch}"
    value, call = run_transfer(node, info, base, training=False)
    q = _q(value)
    read = call.read | info.primitive.meta_args
    for name, argument in info.bound.arguments.items():
        if isinstance(argument, (list, tuple)):
            nodes = [n for n in fx.node.map_aggregate(argument, lambda a: a) if isinstance(n, fx.Node)]
        else:
            nodes = [argument] if isinstance(argument, fx.Node) else []
        if not nodes:
            continue
        if q is not None:
            assert name in read, f"{label}: `{name}` depends on the input, was not read, and the result is known"
        raised = {**base, **{n: Growth(3.0) for n in nodes}}
        raised_q = _q(run_transfer(node, info, raised, training=False)[0])
        assert _at_most(q, raised_q), f"{label}: raising `{name}` lowered q"
        poisoned = {**base, **{n: Growth(None, culprit="test") for n in nodes}}
        if name not in info.primitive.meta_args | call.selected and "total" not in info.primitive.family:
            poisoned_q = _q(run_transfer(node, info, poisoned, training=False)[0])
            assert poisoned_q is None, f"{label}: unknown `{name}` was certified away"
    for name, (kind, default_value) in numeric.items():
        for moved in _MOVED[kind]:
            if moved == default_value:
                continue
            original = info.bound.arguments.get(name, _ABSENT)
            info.bound.arguments[name] = moved
            try:
                moved_value, moved_call = run_transfer(node, info, base, training=False)
            finally:
                if original is _ABSENT:
                    info.bound.arguments.pop(name)
                else:
                    info.bound.arguments[name] = original
            accepted = info.primitive.params | NEUTRAL
            if _q(moved_value) is not None and "*" not in accepted:
                assert name in moved_call.read or name in accepted, f"{label}: `{name}={moved}` was ignored"


# --- the transfer package mirrors rules/primitives/ ------------------------------------------------

PACKAGE = "qlint/registry/transfers"
SHARED_MODULES = {"base": "the table, the decorator and the default transfer",
                  "combinators": "the helpers several families share"}


def _named_transfers() -> dict[str, dict[str, list[str]]]:
    """transfer name -> TOML file stem -> the ids of the entries of that file that name it."""
    named: dict[str, dict[str, list[str]]] = {}
    for table in entries():
        if "transfer" in table:
            stem = Path(table["source"]).stem
            named.setdefault(table["transfer"], {}).setdefault(stem, []).append(table["id"])
    return named


def _module_of(function: Any) -> str:
    return function.__module__.rsplit(".", 1)[-1]


def test_every_transfer_a_primitive_names_exists():
    missing = [f"{table['source']}: primitive `{table['id']}` names transfer `{table['transfer']}`, which no module "
               f"defines: add `@transfer(\"{table['transfer']}\")` above its function in "
               f"{PACKAGE}/{Path(table['source']).stem}.py"
               for table in entries() if "transfer" in table and table["transfer"] not in transfers.TRANSFERS]
    assert not missing, "\n".join(missing)


def test_transfer_modules_and_primitive_files_correspond():
    modules = {m.name for m in pkgutil.iter_modules(transfers.__path__)} - set(SHARED_MODULES)
    files = {path.stem for path in (rules_dir() / "primitives").glob("*.toml")}
    problems = [f"rules/primitives/{stem}.toml has no transfer module: add {PACKAGE}/{stem}.py (for the transfers "
                f"its entries name)" for stem in sorted(files - modules)]
    problems += [f"{PACKAGE}/{name}.py matches no rules/primitives/*.toml: move each transfer in it to the module of "
                 f"the TOML file that names it, its helpers to combinators.py (the only modules besides the "
                 f"families are {sorted(SHARED_MODULES)})" for name in sorted(modules - files)]
    assert not problems, "\n".join(problems)


def test_every_transfer_lives_in_the_module_of_its_primitive_file():
    """A transfer named from one TOML file is in that file's module; one named from several is in the module
    of a file with the most of its entries, and its docstring names the other files."""
    named = _named_transfers()
    problems = []
    for name, function in sorted(transfers.TRANSFERS.items()):
        module = _module_of(function)
        by_file = named.get(name)
        if by_file is None:
            problems.append(f"transfer `{name}` ({PACKAGE}/{module}.py) is named by no entry of rules/primitives/: "
                            f"name it from an entry (`transfer = \"{name}\"`) or delete it")
            continue
        most = max(len(ids) for ids in by_file.values())
        homes = sorted(stem for stem, ids in by_file.items() if len(ids) == most)
        if module not in homes:
            problems.append(f"transfer `{name}` is in {PACKAGE}/{module}.py, but its entries are in "
                            f"{ {stem: len(ids) for stem, ids in by_file.items()} }: move it to "
                            f"{PACKAGE}/{homes[0]}.py")
            continue
        for other in sorted(set(by_file) - {module}):
            if f"{other}.toml" not in (function.__doc__ or ""):
                problems.append(f"transfer `{name}` ({PACKAGE}/{module}.py) is also named by rules/primitives/"
                                f"{other}.toml ({', '.join(by_file[other])}): say so in its docstring "
                                f"(``{other}.toml``)")
    assert not problems, "\n".join(problems)


# --- every primitive has a test row -------------------------------------------------------------------
# An entry with an ATen op gets its rows from the laws above (test_transfer_laws, one per overload). The laws
# reach neither an entry without one (a module, a library function, a method spelling) nor an `unbounded` one:
# each of those names here the test, or the adversarial case (a key of fixtures/adversarial/CASES*.toml, run
# by tests/e2e/test_adversarial.py), that runs it. The row's source must spell one of the entry's ops or targets,
# or the text given with it.

HAND_ROWS: dict[str, Any] = {
    "gumbel_softmax": "fixtures/adversarial/sign_facts.py:gumbel_tau_zero",
    "grouped_mm": "tests/capture/test_hops.py::test_an_expert_weight_computed_from_the_input_is_bilinear",
    "normalize": "tests/registry/test_primitives.py::test_exponent",
    "mha_module": "fixtures/adversarial/transfers.py:mha_value_square",
    "lp_pool": "fixtures/adversarial/transfers.py:lp_pool_even_power",
    "flex_attention": "fixtures/adversarial/r2_constants.py:flex_attention_eval_safe",
    "stochastic_depth": "tests/registry/test_real_code_gaps.py::test_stochastic_depth_is_a_dropout_mask",
    "window_attention": "tests/registry/test_real_code_gaps.py::test_shifted_window_attention_is_affine_in_its_input",
    "cast_float": "fixtures/adversarial/r1_precision.py:upcast_safe",
    "cast_int": "fixtures/adversarial/r2_casts.py:int64_token_bucket_safe",
    "cast_bool": "fixtures/adversarial/trace_gap.py:zero_gate_read_as_a_value",
    "getattr": ("fixtures/adversarial/r1_bookkeeping.py:complex_view_gaussian", ".shape"),  # x.shape under fx
    "patch_merging_pad": "tests/registry/test_real_code_gaps.py::test_patch_merging_pad_keeps_entries_or_zero",
    "relative_position_bias": "tests/registry/test_real_code_gaps.py::test_relative_position_bias_selects_table_entries",
    "poles": "tests/test_coverage.py::test_tan_stays_unknown",
    "nan_domains": "fixtures/adversarial/r2_relations.py:elevation_asin",
    "superlinear_special": ("tests/capture/test_capture.py::test_an_undeclared_op_inside_an_inlined_module_stays_unknown",
                            "Bessel"),
    "linear_algebra": "fixtures/adversarial/r1_linalg.py:det_gate",
    "grouped_mm_kernel":
        "tests/capture/test_hops.py::test_torchs_grouped_mm_kernel_leaves_rows_unwritten_and_is_not_bounded",
    "roi_pooling": "tests/registry/test_real_code_gaps.py::test_roi_align_is_deliberately_unknown_with_a_reason",
    "mha_functional":
        "tests/registry/test_real_code_gaps.py::test_functional_multi_head_attention_has_the_exponent_of_its_value",
    "symbolic": "tests/registry/test_real_code_gaps.py::test_symbolic_scalars_take_the_largest_input",
    "detection_ops": "tests/registry/test_real_code_gaps.py::test_detection_ops_are_deliberately_unknown_with_a_reason",
}
# entries no test runs yet (each is a debt: give it a row in HAND_ROWS and remove it here)
WITHOUT_ROWS: set[str] = set()

ROOT = Path(__file__).resolve().parents[2]


def _spellings_of(table: dict[str, Any]) -> set[str]:
    """The names a test that runs the entry writes: its ops, the last part of each target and module."""
    names = set(table.get("ops", [])) | set(table.get("modules", []))
    names |= {target.removeprefix("method:").removeprefix("module:") for target in table.get("targets", [])}
    return {name.rsplit(".", 1)[-1] for name in names}


def _adversarial_cases() -> set[str]:
    keys: set[str] = set()
    for path in sorted((ROOT / "fixtures/adversarial").glob("CASES*.toml")):
        with path.open("rb") as handle:
            keys |= set(tomllib.load(handle).get("cases", {}))
    return keys


def _row_problem(row: Any, table: dict[str, Any], cases: set[str]) -> Optional[str]:
    """Why the row does not run the entry, or None."""
    where, spelled = row if isinstance(row, tuple) else (row, None)
    path, _, function = where.partition("::") if "::" in where else where.partition(":")
    if path.startswith("fixtures/adversarial/") and f"{Path(path).name}:{function}" not in cases:
        return f"`{Path(path).name}:{function}` is no case of fixtures/adversarial/CASES*.toml"
    if not (ROOT / path).is_file():
        return f"{path} does not exist"
    text = (ROOT / path).read_text()
    found = [node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name == function]
    if not found:
        return f"{path} defines no function `{function}`"
    first = min([found[0].lineno] + [d.lineno for d in found[0].decorator_list])
    source = "\n".join(text.splitlines()[first - 1 : found[0].end_lineno])
    if spelled is not None:
        return None if spelled in source else f"its source has no `{spelled}`"
    names = _spellings_of(table)
    if not any(re.search(rf"(?<!\w){re.escape(name)}(?!\w)", source) for name in names):
        return f"its source spells none of {sorted(names)}"
    return None


def test_every_primitive_has_a_test_row():
    by_laws = {label.split(":")[0] for label, _ in CASES}
    cases = _adversarial_cases()
    ids = {table["id"] for table in entries()}
    problems = []
    for table in entries():
        primitive, source = table["id"], table["source"]
        if primitive in by_laws:
            continue
        if primitive in HAND_ROWS:
            why = _row_problem(HAND_ROWS[primitive], table, cases)
            if why is not None:
                problems.append(f"primitive `{primitive}` ({source}): its row {HAND_ROWS[primitive]} in HAND_ROWS "
                                f"(tests/registry/test_registry.py) does not run it: {why}")
        elif primitive not in WITHOUT_ROWS:
            problems.append(f"primitive `{primitive}` ({source}) has no test row: the transfer laws reach only "
                            f"entries with an ATen op that are not `unbounded`, so write a test that runs it (a row "
                            f"of tests/registry/test_primitives.py::test_exponent, or a case in fixtures/adversarial/) "
                            f"and add `\"{primitive}\": \"tests/<folder>/<file>.py::<test>\"` to HAND_ROWS in "
                            f"tests/registry/test_registry.py")
    problems += [f"HAND_ROWS / WITHOUT_ROWS in tests/registry/test_registry.py name `{stale}`, which the laws already "
                 f"reach or no entry has: remove it" for stale in sorted((set(HAND_ROWS) | WITHOUT_ROWS) & by_laws
                                                                    | (set(HAND_ROWS) | WITHOUT_ROWS) - ids)]
    problems += [f"`{both}` is in both HAND_ROWS and WITHOUT_ROWS: remove it from WITHOUT_ROWS"
                 for both in sorted(set(HAND_ROWS) & WITHOUT_ROWS)]
    assert not problems, "\n".join(problems)
