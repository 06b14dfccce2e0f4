"""Project configuration: ``[tool.qlint]`` in pyproject.toml, or ``qlint.toml``.

Discovery and precedence follow ruff:

* the nearest config file upward from the start folder wins (in each folder
  ``.qlint.toml``, then ``qlint.toml``, then ``pyproject.toml`` *if* it has a
  ``[tool.qlint]`` table); ``--config PATH`` names one explicitly and
  ``--isolated`` ignores them all;
* in ``qlint.toml`` / ``.qlint.toml`` the keys are top-level, in pyproject.toml
  they live under ``[tool.qlint]``;
* command-line flags override the file; per-model tables override the file's
  top-level settings for that model; the CLI overrides both;
* rule selection (``select`` / ``extend-select`` / ``ignore``) is resolved in
  layers (defaults, file, CLI) where the most specific prefix wins and, at equal
  specificity, ``ignore`` wins; a layer's ``select`` replaces everything before.

Nothing here imports torch. Every malformed value raises :class:`ConfigError`
whose message names the offending key.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from qlint.ci.cache import CACHE_DIR_NAME
from qlint.ci.formats import OUTPUT_FORMATS  # the registered renderers' names (torch-free)
from qlint.core.errors import QlintError
from qlint.core.results import SEVERITY_RANK
from qlint.core.toml import tomllib
from qlint.loader import is_path_spec, join_spec, parse_shape, split_spec

CONFIG_FILES = (".qlint.toml", "qlint.toml", "pyproject.toml")
SEVERITIES = tuple(SEVERITY_RANK)  # info, warning, error
MODES = ("train", "eval")
# seconds one model may take (load, trace, analyse, witness) before its worker is killed: a LLaMA-2-7B config on
# the meta device takes a few minutes on a loaded 2-core machine, a factory that hangs never ends
DEFAULT_TIMEOUT = 1200.0
TRACERS = ("symbolic_trace", "export", "make_fx")  # qlint.capture.trace.TRACERS (which imports torch)
try:
    from qlint.loader import DTYPES  # the dtypes --input-dtype accepts (torch-free import)
except ImportError:  # pragma: no cover
    DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32")
_SELECTOR = re.compile(r"^(ALL|QL[0-9]{0,3})$")


class ConfigError(QlintError):
    """A malformed configuration file or value (the CLI turns it into exit 2)."""


# ---------------------------------------------------------------------------
# Rule selection
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleSelection:
    """One layer of rule selectors (defaults, the config file or the CLI)."""

    select: Optional[tuple[str, ...]] = None  # None: this layer does not reset
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def is_empty(self) -> bool:
        return self.select is None and not self.extend_select and not self.ignore


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def resolve_selected(code: str, layers: Sequence[RuleSelection]) -> bool:
    """Is ``code`` enabled after applying ``layers`` in order (ruff's algorithm)?

    Within a layer the matching selector of highest specificity decides (``ALL``
    < ``QL`` < ``QL1`` < ``QL10`` < ``QL101``); at equal specificity ``ignore``
    wins. A layer with ``select`` starts from nothing; one without only applies
    its updates on top. As in ruff, ``select = []`` with only ``ignore`` carries
    those ignores over to the next layer.
    """
    enabled = False
    carried: tuple[str, ...] = ()
    for layer in layers:
        selects = (layer.select or ()) + layer.extend_select
        ignores = layer.ignore + carried
        carried = ()
        best = -1
        decision: Optional[bool] = None
        for selector in selects:
            if _matches(selector, code) and _specificity(selector) > best:
                best, decision = _specificity(selector), True
        for selector in ignores:
            if _matches(selector, code) and _specificity(selector) >= best:
                best, decision = _specificity(selector), False
        if layer.select is not None:
            enabled = decision is True
            if not layer.select and not layer.extend_select and layer.ignore:
                carried = layer.ignore
        elif decision is not None:
            enabled = decision
    return enabled


DEFAULT_SELECTION = RuleSelection(select=("ALL",))


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelOverride:
    """Settings for one model (``[tool.qlint.per-model."SPEC"]``); None = inherit."""

    input_shapes: Optional[tuple[tuple[int, ...], ...]] = None
    input_dtype: Optional[str] = None
    device: Optional[str] = None
    mode: Optional[str] = None
    tracer: Optional[str] = None
    threshold: Optional[float] = None


@dataclass(frozen=True)
class ModelOptions:
    """The effective settings for analysing one model (CLI > per-model > file)."""

    spec: str
    input_shapes: Optional[tuple[tuple[int, ...], ...]]
    input_dtype: Optional[str]
    device: Optional[str]
    mode: Optional[str]
    tracer: Optional[str]
    threshold: float


@dataclass
class Config:
    """The resolved settings; build with :func:`load_config`, then :meth:`merge_cli`."""

    path: Optional[Path] = None  # the config file read, if any
    root: Path = field(default_factory=Path.cwd)  # its folder (or the cwd)
    models: list[str] = field(default_factory=list)
    selection: tuple[RuleSelection, ...] = (DEFAULT_SELECTION,)
    fail_on: str = "error"
    threshold: float = 1.0
    mode: Optional[str] = None
    tracer: Optional[str] = None
    device: Optional[str] = None
    input_dtype: Optional[str] = None
    input_shapes: Optional[tuple[tuple[int, ...], ...]] = None
    output_format: str = "full"
    baseline: Optional[Path] = None
    per_block_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    per_model: dict[str, ModelOverride] = field(default_factory=dict)
    per_model_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)  # normalised spec -> selectors
    primitives: dict[str, tuple[float, str]] = field(default_factory=dict)
    cli: ModelOverride = field(default_factory=ModelOverride)
    cache_dir: Optional[Path] = None  # None: ROOT/.qlint_cache
    use_cache: bool = True
    witness: bool = True  # measure what is certified first (qlint.probe.block_witness)
    witness_budget: float = 10.0  # seconds per model
    timeout: float = DEFAULT_TIMEOUT  # seconds a model may take in its worker process (0: no limit)
    unsafe_fixes: bool = False  # --fix may write patches that change the function the model computes

    def describe(self) -> str:
        """The effective settings as ``--show-settings`` prints them (ruff's ``--show-settings``)."""
        from qlint.lint.rule import rules

        enabled = [code for code in rules() if self.is_selected(code)]
        rows = [
            ("config file", str(self.path) if self.path else "none (defaults)"),
            ("models", ", ".join(self.models) or "none"),
            ("enabled rules", f"{len(enabled)}: {', '.join(enabled)}"),
            ("fail-on", self.fail_on),
            ("threshold", f"{self.threshold:g}"),
            ("mode", self.cli.mode or self.mode or "the model's own"),
            ("tracer", self.cli.tracer or self.tracer or "symbolic_trace, then export, then make_fx"),
            ("device", self.cli.device or self.device or "the factory's"),
            ("input-shapes",
             ", ".join(",".join(map(str, s)) for s in (self.cli.input_shapes or self.input_shapes or ())) or "none"),
            ("output-format", self.output_format),
            ("baseline", str(self.baseline) if self.baseline else "none"),
            ("per-block-ignores", ", ".join(f"{k} = {list(v)}" for k, v in self.per_block_ignores.items()) or "none"),
            ("per-model-ignores", ", ".join(f"{k} = {list(v)}" for k, v in self.per_model_ignores.items()) or "none"),
            ("per-model", ", ".join(self.per_model) or "none"),
            ("primitives", ", ".join(f"{k} (q = {q:g})" for k, (q, _) in self.primitives.items()) or "none"),
            ("cache", str(self.cache_path()) if self.use_cache else "off"),
            ("witness", f"on, {self.witness_budget:g} s per model" if self.witness else "off"),
            ("timeout", f"{self.timeout:g} s per model" if self.timeout else "none"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def cache_path(self) -> Path:
        """Where the result cache lives (:mod:`qlint.ci.cache`)."""
        return self.cache_dir if self.cache_dir is not None else self.root / CACHE_DIR_NAME

    # -- rules ---------------------------------------------------------------

    def is_selected(self, code: str) -> bool:
        """Whether rule ``code`` is enabled (prefix matching, ruff semantics)."""
        return resolve_selected(code, self.selection)

    def block_ignores(self, block: Optional[str]) -> set[str]:
        """The rule selectors ``per-block-ignores`` applies to this block name."""
        if not block:
            return set()
        out: set[str] = set()
        for pattern, codes in self.per_block_ignores.items():
            if fnmatch.fnmatchcase(block, pattern):
                out.update(codes)
        return out

    def model_ignores(self, spec: str) -> tuple[str, ...]:
        """The rule selectors ``per-model-ignores`` applies to this model."""
        return self.per_model_ignores.get(normalize_spec(spec, Path.cwd()), ())

    def fails(self, severity: str) -> bool:
        """Does a finding of this severity make the run fail (``fail-on``)?"""
        return SEVERITY_RANK.get(severity, 2) >= SEVERITY_RANK[self.fail_on]

    # -- models --------------------------------------------------------------

    def options_for(self, spec: str) -> ModelOptions:
        """Effective settings for one model: CLI flags > per-model table > file."""
        per = self.per_model.get(normalize_spec(spec, Path.cwd()), ModelOverride())

        def pick(name: str) -> Any:
            for layer in (self.cli, per):
                value = getattr(layer, name)
                if value is not None:
                    return value
            return getattr(self, name)

        return ModelOptions(
            spec=spec,
            input_shapes=pick("input_shapes"),
            input_dtype=pick("input_dtype"),
            device=pick("device"),
            mode=pick("mode"),
            tracer=pick("tracer"),
            threshold=pick("threshold"),
        )

    # -- the command line ----------------------------------------------------

    def merge_cli(
        self,
        *,
        models: Optional[Sequence[str]] = None,
        select: Optional[Sequence[str]] = None,
        extend_select: Optional[Sequence[str]] = None,
        ignore: Optional[Sequence[str]] = None,
        fail_on: Optional[str] = None,
        threshold: Optional[float] = None,
        mode: Optional[str] = None,
        tracer: Optional[str] = None,
        device: Optional[str] = None,
        input_dtype: Optional[str] = None,
        input_shapes: Optional[Sequence[Any]] = None,
        output_format: Optional[str] = None,
        baseline: Optional[str | os.PathLike[str]] = None,
        no_cache: Optional[bool] = None,
        cache_dir: Optional[str | os.PathLike[str]] = None,
        witness: Optional[bool] = None,
        witness_budget: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> Config:
        """A copy with command-line flags applied on top (None / empty = not given).

        ``models`` (the SPEC arguments) replace the file's ``models``; selector
        flags form a new selection layer (so ``--select QL101`` overrides the
        file's ``ignore = ["QL101"]``, and ``--ignore`` the file's ``select``);
        the per-model flags override the per-model tables too. ``QLINT_NO_CACHE=1`` and
        ``QLINT_CACHE_DIR`` stand in for ``no_cache`` and ``cache_dir`` when those are not given.
        """
        where = "command line"
        layer = RuleSelection(
            select=None if select is None else _selectors(list(select), f"{where} --select", allow_empty=False),
            extend_select=_selectors(list(extend_select or ()), f"{where} --extend-select"),
            ignore=_selectors(list(ignore or ()), f"{where} --ignore"),
        )
        cli = ModelOverride(
            input_shapes=None if not input_shapes else _cli_shapes(input_shapes),
            input_dtype=None if input_dtype is None else _choice(input_dtype, DTYPES, "--input-dtype"),
            device=device,
            mode=None if mode is None else _choice(mode, MODES, "--mode"),
            tracer=None if tracer is None else _tracer(tracer, "--tracer"),
            threshold=None if threshold is None else _threshold(threshold, "--threshold"),
        )
        return replace(
            self,
            models=[normalize_spec(s, Path.cwd()) for s in models] if models else list(self.models),
            selection=self.selection if layer.is_empty() else (*self.selection, layer),
            fail_on=self.fail_on if fail_on is None else _choice(fail_on, SEVERITIES, "--fail-on"),
            output_format=(
                self.output_format
                if output_format is None
                else _choice(output_format, OUTPUT_FORMATS, "--output-format")
            ),
            baseline=self.baseline if baseline is None else Path(baseline),
            cli=cli,
            witness=self.witness if witness is None else bool(witness),
            witness_budget=self.witness_budget if witness_budget is None
                       else _seconds(witness_budget, "--witness-budget"),
            timeout=self.timeout if timeout is None else _seconds(timeout, "--timeout"),
            use_cache=not (no_cache if no_cache is not None else _env_flag("QLINT_NO_CACHE")),
            cache_dir=Path(cache_dir or os.environ["QLINT_CACHE_DIR"]).resolve()
            if cache_dir or os.environ.get("QLINT_CACHE_DIR") else self.cache_dir,
        )


def _env_flag(name: str) -> bool:
    """An environment switch: set and not 0 / false / no / off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def find_config_file(start: Path) -> Optional[Path]:
    """The nearest qlint config file at or above ``start`` (ruff's discovery)."""
    start = start.resolve()
    for folder in (start, *start.parents):
        for name in CONFIG_FILES:
            candidate = folder / name
            if not candidate.is_file():
                if candidate.is_symlink() or candidate.exists():  # a folder, a dangling link: never skipped silently
                    raise ConfigError(not_a_file(candidate))
                continue
            if name != "pyproject.toml" or _has_tool_qlint(candidate):
                return candidate
    return None


def not_a_file(path: Path) -> str:
    """Why a configuration path that exists in some form cannot be read as a file (one line)."""
    hint = "fix or remove it, name the file with --config PATH, or ignore every file with --isolated"
    if path.is_symlink() and not path.exists():
        return f"{path} is a broken symbolic link (to {os.readlink(path)}): {hint}"
    if path.is_dir():
        return f"{path} is a folder, not a configuration file: {hint}"
    return f"{path} is not a regular file: {hint}"


def _has_tool_qlint(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:  # unreadable: an error, not a file silently passed over
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return "[tool.qlint" in text  # a broken pyproject.toml that mentions us is still ours to complain about
    return isinstance(data.get("tool"), dict) and "qlint" in data["tool"]


def load_config(
    start_dir: str | os.PathLike[str] | None = None,
    *,
    config_path: str | os.PathLike[str] | None = None,
    isolated: bool = False,
    overrides: Iterable[str] = (),
) -> Config:
    """Find, parse and validate the configuration.

    ``config_path`` names the file (``--config PATH``); ``isolated`` ignores
    every file (``--isolated``); ``overrides`` are inline TOML ``KEY = VALUE``
    snippets (``--config "fail-on = 'warning'"``) applied on top, as in ruff.
    """
    start = Path(start_dir) if start_dir is not None else Path.cwd()
    path: Optional[Path] = None
    if config_path is not None:
        path = Path(config_path)
        if not path.is_file():
            raise ConfigError(not_a_file(path) if path.is_symlink() or path.exists()
                              else f"config file not found: {path}")
    elif not isolated:
        path = find_config_file(start)

    table: dict[str, Any] = {}
    prefix = ""
    if path is not None:
        table, prefix = _extended_table(path, seen=())
    root = path.resolve().parent if path is not None else start.resolve()
    for snippet in overrides:
        try:
            extra = tomllib.loads(snippet)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"--config {snippet!r}: not a TOML 'key = value' ({exc})") from None
        try:  # an override is checked on its own, so its mistake is blamed on it, not on the file
            parse_config(extra, root=root)
        except ConfigError as exc:
            raise ConfigError(f"--config {snippet!r}: {exc}") from None
        table = _deep_merge(table, extra)
    try:
        return parse_config(table, root=root, path=path, prefix=prefix)
    except ConfigError as exc:
        if not overrides or path is None:
            raise
        try:
            parse_config(_extended_table(path, seen=())[0], root=root, path=path, prefix=prefix)
        except ConfigError:
            raise exc from None  # the file's own mistake
        shown = ", ".join(repr(snippet) for snippet in overrides)
        raise ConfigError(f"{exc} (with the inline override --config {shown})") from None


def _read_table(path: Path) -> tuple[dict[str, Any], str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    if path.name == "pyproject.toml":
        tool = data.get("tool", {})
        table = tool.get("qlint", {}) if isinstance(tool, dict) else {}
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: 'tool.qlint' must be a table")
        return table, "tool.qlint."
    return data, ""


def _extended_table(path: Path, seen: tuple[Path, ...]) -> tuple[dict[str, Any], str]:
    """The file's table on top of the one its ``extend = "../pyproject.toml"`` names (recursively,
    as ruff): the base's paths are made absolute first, so they keep meaning its folder."""
    table, prefix = _read_table(path)
    base_name = table.pop("extend", None)
    if base_name is None:
        return table, prefix
    where = f"{path}: '{prefix}extend'"
    if not isinstance(base_name, str):
        raise ConfigError(f"{where} must be a path to another configuration file")
    base = (path.parent / base_name).resolve()
    if base in seen or base == path.resolve():
        raise ConfigError(f"{where}: {base_name} extends back to {path} (a cycle)")
    if not base.is_file():
        raise ConfigError(f"{where}: {base_name} not found (resolved to {base})")
    base_table, _ = _extended_table(base, (*seen, path.resolve()))
    return _deep_merge(_absolute_paths(base_table, base.parent), table), prefix


def _absolute_paths(table: dict[str, Any], root: Path) -> dict[str, Any]:
    """A base configuration's file paths and file specs, resolved against its own folder."""
    def spec(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        target, attribute = split_spec(value)
        return (join_spec(str(root / target), attribute) if is_path_spec(target) and not Path(target).is_absolute()
                else value)

    out = dict(table)
    if isinstance(out.get("models"), list):
        out["models"] = [spec(m) for m in out["models"]]
    for name in ("baseline", "cache-dir"):
        if isinstance(out.get(name), str) and not Path(out[name]).is_absolute():
            out[name] = str(root / out[name])
    for key in ("per-model", "per-model-ignores"):
        if isinstance(out.get(key), dict):
            out[key] = {spec(name): value for name, value in out[key].items()}
    return out


def _deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


TOP_KEYS = (
    "models", "select", "extend-select", "ignore", "fail-on", "threshold", "mode",
    "tracer", "device", "input-dtype", "input-shapes", "output-format", "baseline",
    "per-block-ignores", "per-model-ignores", "per-model", "primitives", "cache-dir", "witness", "witness-budget",
    "timeout", "unsafe-fixes",
)  # fmt: skip  (and `extend`, read before validation)
MODEL_KEYS = ("input-shapes", "input-dtype", "device", "mode", "tracer", "threshold")


def parse_config(
    table: Mapping[str, Any], *, root: Path, path: Optional[Path] = None, prefix: str = ""
) -> Config:
    """Validate a ``[tool.qlint]`` table (already parsed) into a :class:`Config`."""
    where = f"{path}: " if path is not None else ""

    def key(name: str) -> str:
        return f"{where}'{prefix}{name}'"

    def fail(message: str) -> ConfigError:
        return ConfigError(message)

    _check_keys(table, TOP_KEYS, where, prefix)
    cfg = Config(path=path, root=root)
    get = table.get

    written_models: list[str] = []
    if "models" in table:
        written_models = _str_list(get("models"), key("models"))
        cfg.models = [normalize_spec(s, root) for s in written_models]
    if any(k in table for k in ("select", "extend-select", "ignore")):
        layer = RuleSelection(
            select=_selectors(get("select"), key("select"), allow_empty=False) if "select" in table else None,
            extend_select=_selectors(get("extend-select", []), key("extend-select")),
            ignore=_selectors(get("ignore", []), key("ignore")),
        )
        cfg.selection = (DEFAULT_SELECTION, layer)
    if "fail-on" in table:
        cfg.fail_on = _choice(get("fail-on"), SEVERITIES, key("fail-on"))
    if "threshold" in table:
        cfg.threshold = _threshold(get("threshold"), key("threshold"))
    if "mode" in table:
        cfg.mode = _choice(get("mode"), MODES, key("mode"))
    if "tracer" in table:
        cfg.tracer = _tracer(get("tracer"), key("tracer"))
    if "device" in table:
        cfg.device = _nonempty_str(get("device"), key("device"))
    if "input-dtype" in table:
        cfg.input_dtype = _choice(get("input-dtype"), DTYPES, key("input-dtype"))
    if "input-shapes" in table:
        cfg.input_shapes = _shapes(get("input-shapes"), key("input-shapes"))
    if "output-format" in table:
        cfg.output_format = _choice(get("output-format"), OUTPUT_FORMATS, key("output-format"))
    if "baseline" in table:
        cfg.baseline = root / _nonempty_str(get("baseline"), key("baseline"))
    if "cache-dir" in table:
        cfg.cache_dir = (root / _nonempty_str(get("cache-dir"), key("cache-dir"))).resolve()
    if "witness" in table:
        if not isinstance(get("witness"), bool):
            raise fail(f"{key('witness')} must be true or false (got {_type_name(get('witness'))})")
        cfg.witness = get("witness")
    if "witness-budget" in table:
        cfg.witness_budget = _seconds(get("witness-budget"), key("witness-budget"))
    if "timeout" in table:
        cfg.timeout = _seconds(get("timeout"), key("timeout"))
    if "unsafe-fixes" in table:
        if not isinstance(get("unsafe-fixes"), bool):
            raise fail(f"{key('unsafe-fixes')} must be true or false (got {_type_name(get('unsafe-fixes'))})")
        cfg.unsafe_fixes = get("unsafe-fixes")

    if "per-block-ignores" in table:
        raw = get("per-block-ignores")
        if not isinstance(raw, dict):
            raise fail(f"{key('per-block-ignores')} must be a table of block-name glob -> rule codes")
        for pattern, codes in raw.items():
            sub = key(f'per-block-ignores."{pattern}"')
            cfg.per_block_ignores[pattern] = _selectors(codes, sub)

    if "per-model-ignores" in table:
        raw = get("per-model-ignores")
        if not isinstance(raw, dict):
            raise fail(f"{key('per-model-ignores')} must be a table of model spec -> rule codes")
        for spec, codes in raw.items():
            cfg.per_model_ignores[normalize_spec(spec, root)] = _selectors(codes, key(f'per-model-ignores."{spec}"'))
        _names_models(cfg, written_models, raw, root, where, f"{prefix}per-model-ignores")

    if "per-model" in table:
        raw = get("per-model")
        if not isinstance(raw, dict):
            raise fail(f"{key('per-model')} must be a table of model spec -> settings")
        for spec, settings in raw.items():
            sub_prefix = f'{prefix}per-model."{spec}".'
            if not isinstance(settings, dict):
                raise fail(f"{where}'{sub_prefix[:-1]}' must be a table")
            _check_keys(settings, MODEL_KEYS, where, sub_prefix)

            cfg.per_model[normalize_spec(spec, root)] = _model_override(settings, where, sub_prefix)
        _names_models(cfg, written_models, raw, root, where, f"{prefix}per-model")

    if "primitives" in table:
        raw = get("primitives")
        if not isinstance(raw, dict):
            raise fail(f"{key('primitives')} must be a table of 'module.Class' -> {{ q = ..., why = ... }}")
        for name, entry in raw.items():
            sub_prefix = f'{prefix}primitives."{name}".'
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+", name):
                raise fail(f"{where}'{sub_prefix[:-1]}': expected a dotted 'module.Class' name")
            if not isinstance(entry, dict):
                raise fail(f"{where}'{sub_prefix[:-1]}' must be an inline table {{ q = 0, why = \"...\" }}")
            _check_keys(entry, ("q", "why"), where, sub_prefix)
            if "q" not in entry:
                raise fail(f"{where}'{sub_prefix}q' is required")
            q = entry["q"]
            if isinstance(q, bool) or not isinstance(q, (int, float)) or math.isnan(q) or q < 0:
                raise fail(f"{where}'{sub_prefix}q' must be a number >= 0 (got {q!r})")
            why = entry.get("why")
            if not isinstance(why, str) or not why.strip():
                raise fail(f"{where}'{sub_prefix}why' is required: a short justification of the exponent")
            cfg.primitives[name] = (float(q), why.strip())
    return cfg


def _model_override(settings: Mapping[str, Any], where: str, prefix: str) -> ModelOverride:
    """One ``[tool.qlint.per-model."SPEC"]`` table (keys already checked)."""
    parsers: dict[str, Any] = {
        "input-shapes": _shapes,
        "input-dtype": lambda v, k: _choice(v, DTYPES, k),
        "device": _nonempty_str,
        "mode": lambda v, k: _choice(v, MODES, k),
        "tracer": _tracer,
        "threshold": _threshold,
    }
    values = {
        name.replace("-", "_"): parse(settings[name], f"{where}'{prefix}{name}'")
        for name, parse in parsers.items()
        if name in settings
    }
    return ModelOverride(**values)


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], where: str, prefix: str) -> None:
    for name in table:
        if name in allowed:
            continue
        guess = difflib.get_close_matches(str(name).replace("_", "-"), allowed, n=1, cutoff=0.6)
        hint = f" (did you mean '{guess[0]}'?)" if guess else f" (known keys: {', '.join(allowed)})"
        raise ConfigError(f"{where}unknown key '{prefix}{name}'{hint}")


def _type_name(value: Any) -> str:
    return {str: "a string", int: "an integer", float: "a float", bool: "a boolean",
            list: "an array", dict: "a table"}.get(type(value), type(value).__name__)  # fmt: skip


def _str_list(value: Any, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{key} must be an array of non-empty strings (got {_type_name(value)})")
    return [v.strip() for v in value]


def _names_models(cfg: Config, written: list[str], raw: dict[str, Any], root: Path, where: str, table: str) -> None:
    """A ``per-model`` / ``per-model-ignores`` key that names none of the file's ``models`` is
    a typo that would silently not apply: an error with a did-you-mean (no check when
    ``models`` is unset)."""
    if not written:
        return
    for spec in raw:
        if normalize_spec(spec, root) not in cfg.models:
            guess = difflib.get_close_matches(spec, written, n=1, cutoff=0.6)
            hint = f"; did you mean '{guess[0]}'?" if guess else f" (models: {', '.join(written)})"
            raise ConfigError(f"{where}'{table}.\"{spec}\"' names no model in 'models'{hint}")


def _selectors(value: Any, key: str, *, allow_empty: bool = True) -> tuple[str, ...]:
    """Rule selectors, each of which must name at least one rule: a typo never turns a rule off silently."""
    from qlint.lint.rule import rules

    items = _str_list(value, key)
    if not items and not allow_empty:
        raise ConfigError(f"{key} is empty: no rule would run (select 'ALL' for every rule)")
    codes = list(rules())
    out = []
    for item in items:
        if not _SELECTOR.match(item):
            raise ConfigError(
                f"{key}: invalid rule selector '{item}' "
                "(expected 'ALL' or a code prefix such as 'QL', 'QL1' or 'QL101')"
            )
        if item != "ALL" and not any(code.startswith(item) for code in codes):
            prefixes = sorted({code[:n] for code in codes for n in (3, 4, 5)})
            guess = difflib.get_close_matches(item, prefixes, n=1)
            hint = f"; did you mean '{guess[0]}'?" if guess else ""
            raise ConfigError(f"{key}: rule selector '{item}' matches no rule{hint} "
                              "(every code: `qlint explain --all`)")
        out.append(item)
    return tuple(out)


def _choice(value: Any, choices: Sequence[str], key: str) -> str:
    if not isinstance(value, str) or value not in choices:
        guess = difflib.get_close_matches(str(value), choices, n=1) if isinstance(value, str) else []
        hint = f"did you mean '{guess[0]}'? " if guess else ""
        raise ConfigError(f"{key}: invalid value {value!r} ({hint}expected one of: {', '.join(choices)})")
    return value


def _threshold(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{key} must be a finite number >= 0 (got {value!r})")
    return float(value)


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{key} must be a number of seconds >= 0 (got {value!r})")
    return float(value)


def _nonempty_str(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key} must be a non-empty string (got {_type_name(value)})")
    return value.strip()


def _tracer(value: Any, key: str) -> str:
    return _choice(value, TRACERS, key)


def _cli_shapes(values: Sequence[Any]) -> tuple[tuple[int, ...], ...]:
    out = []
    for item in values:
        try:
            out.append(parse_shape(item) if isinstance(item, str) else _shapes([item], "--input-shape")[0])
        except (ValueError, ConfigError):
            raise ConfigError(
                f"invalid --input-shape {item!r}; expected comma-separated positive integers like 2,96,7"
            ) from None
    return tuple(out)


def _shapes(value: Any, key: str) -> tuple[tuple[int, ...], ...]:
    """One shape per model input: ``["2,8,7"]`` or ``[[2, 8, 7]]`` (a single
    ``"2,8,7"`` string means one input)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f'{key} must be an array of shapes such as ["2,8,7"] (got {_type_name(value)})')
    out = []
    for item in value:
        try:
            if isinstance(item, str):
                out.append(parse_shape(item))
            elif isinstance(item, (list, tuple)) and item and all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in item
            ):
                out.append(tuple(item))
            else:
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"{key}: invalid shape {item!r} (expected a string like \"2,8,7\" or an array of positive integers)"
            ) from None
    return tuple(out)


# ---------------------------------------------------------------------------
# Model specs
# ---------------------------------------------------------------------------


def normalize_spec(spec: str, base: Path) -> str:
    """Resolve a file spec's path against ``base``; show it relative to the cwd.

    ``"model.py:f"`` in a config file in ``sub/`` becomes ``"sub/model.py:f"``
    when qlint runs from the parent folder; module specs (``pkg.mod:f``) are
    returned unchanged.
    """
    target, attr = split_spec(spec.strip())
    if not is_path_spec(target):
        return spec.strip()
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = base / path
    path = Path(os.path.normpath(path))
    try:
        rel = os.path.relpath(path, Path.cwd())
    except ValueError:  # another drive on Windows
        rel = str(path)
    shown = str(path) if rel.startswith("..") else rel
    return join_spec(shown.replace(os.sep, "/"), attr)
