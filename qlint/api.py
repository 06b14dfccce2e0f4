"""The public entry points, equal to the command line: configuration, declared primitives,
suppressions and the baseline are applied here, once, for both.

``qlint.check(["model.py:build"])`` returns the same :class:`~qlint.core.results.Report`
as ``qlint model.py:build --format json`` in the same folder (``Report.to_dict()`` is
that JSON document); ``qlint.analyze(model, inputs)`` does the same for a model object.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from qlint.ci.cache import ResultCache, read_files
from qlint.ci.config import Config, ConfigError, load_config
from qlint.ci.workers import WorkerDied
from qlint.core.errors import QlintError
from qlint.core.results import ModelReport, Report


def configure(specs: Optional[Sequence[str]] = None, *, config: Union[str, Path, None] = None, isolated: bool = False,
              overrides: Iterable[str] = (), cwd: Union[str, Path, None] = None, **flags: Any) -> Config:
    """The effective configuration: discovered (or given) file, inline overrides, then flags.

    ``flags`` are the command line's options by their Python names (``select``,
    ``ignore``, ``fail_on``, ``threshold``, ``mode``, ``tracer``, ``device``,
    ``input_shapes``, ``input_dtype``, ``output_format``, ``baseline`` ...).
    """
    start = Path(cwd) if cwd is not None else Path.cwd()
    loaded = load_config(start, config_path=str(config) if config is not None else None, isolated=isolated,
                         overrides=list(overrides))
    return loaded.merge_cli(models=list(specs) if specs else None, **flags)


def check(specs: Optional[Sequence[str]] = None, *, config: Union[str, Path, None] = None, isolated: bool = False,
          overrides: Iterable[str] = (), remedies: bool = False, jobs: int = 1, cwd: Union[str, Path, None] = None,
          supervised: Optional[bool] = None, **flags: Any) -> Report:
    """Analyse each spec (or the configured ``models``) as ``qlint check`` does, the result
    cache included (``no_cache=True`` turns it off), ``jobs`` models at a time.

    A model that fails is in the report with verdict ``failed`` (``Report.failures``),
    not raised, so the others are still checked. ``supervised=True`` runs the models in
    supervised worker processes, as the command line always does (a model's ``os._exit`` or
    segfault is then its failure, not the end of your process); the default is worker
    processes when ``jobs > 1``, else this process (a ``sys.exit()`` in the model's code is
    still its failure, and what it prints goes to stderr).
    """
    settings = configure(specs, config=config, isolated=isolated, overrides=overrides, cwd=cwd, **flags)
    if not settings.models:
        raise ConfigError("no models to check: give specs, or list them in [tool.qlint] models = [...]")
    report = analyse_configured(settings, remedies=remedies, jobs=jobs, supervised=supervised)
    if settings.baseline is not None:
        from qlint.ci.baseline import filter_new

        report = filter_new(report, settings.baseline)
    return report


def analyse_configured(settings: Config, *, remedies: bool = False, jobs: int = 1,
                       on_failure: Optional[Callable[[str, BaseException], None]] = None,
                       supervised: Optional[bool] = None, faulthandler: bool = False,
                       on_note: Optional[Callable[[str, str], None]] = None) -> Report:
    """Every configured model: its per-model settings, declared primitives, suppressions.

    A model whose inputs are unchanged is replayed from the result cache without torch
    (:mod:`qlint.ci.cache`; ``settings.use_cache``); the others are analysed and stored.
    ``supervised`` (default: ``jobs > 1``) runs them in worker processes, ``jobs`` at a time
    (:mod:`qlint.ci.workers`: a worker that dies costs only the model it held); else they run
    here, one after the other. Either way the model's code is guarded: a ``sys.exit()`` in it
    is that model's failure, and what it prints goes to stderr. A model that cannot be loaded,
    traced or analysed does not stop the others: its report is :meth:`ModelReport.failed`
    (verdict ``failed``) and ``on_failure(spec, exception)`` is called, e.g. to print the
    traceback. ``on_note(level, text)`` hears what the cache did (``"warning"``: the cache is
    off and why; ``"info"``: an entry that was ignored). Ctrl-C still stops the run.
    """
    from qlint.ci.suppress import apply_suppressions
    from qlint.loader import check_spec

    def note(level: str, text: str) -> None:
        if on_note is not None:
            on_note(level, text)

    cache = ResultCache(settings.cache_path()) if settings.use_cache else None
    if cache is not None and (problem := cache.problem()) is not None:
        note("warning", f"results are not cached: {problem}")
    models: dict[int, ModelReport] = {}
    pending: list[tuple[int, str, Optional[str]]] = []
    replayed: set[str] = set()
    for index, spec in enumerate(settings.models):
        try:
            check_spec(spec)  # a missing file or a folder is reported without importing torch
        except Exception as exc:  # noqa: BLE001
            models[index] = _failed(spec, exc, on_failure)
            continue
        key = cache_key(cache, settings, spec, remedies) if cache is not None else None  # before any model loads
        cached = cache.lookup(key) if cache is not None and key is not None else None
        if cached is not None:
            models[index] = cached
            replayed.add(spec)
        else:
            if cache is not None and cache.why not in ("", "no entry") and not cache.why.endswith(" changed"):
                note("info", f"{spec}: {cache.why}")
            pending.append((index, spec, key))
    supervised = jobs > 1 if supervised is None else supervised
    outcomes = _analyse_each(settings, [(spec, key) for _, spec, key in pending], remedies, jobs, supervised,
                             faulthandler)
    for (index, spec, _), outcome in zip(pending, outcomes):
        if isinstance(outcome, WorkerDied):  # named here: the supervisor knows tasks, not specs
            outcome = WorkerDied(f"{spec}: {outcome}")
        models[index] = outcome if isinstance(outcome, ModelReport) else _failed(spec, outcome, on_failure)
    return Report(apply_suppressions([models[i] for i in range(len(settings.models))], settings),
                  from_cache=frozenset(replayed))


def cache_key(cache: ResultCache, settings: Config, spec: str, remedies: bool) -> str:
    """The cache key of one model's analysis: its effective options and declared primitives."""
    from dataclasses import asdict

    options = {**asdict(settings.options_for(spec)), "remedies": remedies, "primitives": settings.primitives,
               "witness": settings.witness, "witness_budget": settings.witness_budget}
    return cache.key(spec, options)


def analyse_one(settings: Config, spec: str, remedies: bool, key: Optional[str] = None) -> ModelReport:
    """Load, trace and analyse one model; stored in the cache under ``key`` (computed by the run
    before any model was loaded, since loading extends sys.path) with the files it read."""
    with collections_eased():
        report = _one(settings, spec, remedies=remedies)
    if settings.use_cache and key is not None:
        ResultCache(settings.cache_path()).store(key, report, read_files())
    return report


def _analyse_each(settings: Config, specs: list[tuple[str, Optional[str]]], remedies: bool, jobs: int,
                  supervised: bool, faulthandler: bool = False) -> list[Union[ModelReport, BaseException]]:
    """Each spec's report, or the exception that stopped it, in order: in ``jobs`` supervised
    worker processes, or here with the model's stdout sent to stderr."""
    if not specs:
        return []
    if supervised:
        from qlint.ci.workers import Supervisor

        return Supervisor(min(jobs, len(specs)), faulthandler=faulthandler, timeout=settings.timeout).run(
            _worker, [(settings, spec, remedies, key) for spec, key in specs])
    outcomes: list[Union[ModelReport, BaseException]] = []
    for spec, key in specs:
        try:
            with model_code(spec):  # the caller's stdout is not the model's; its sys.exit() is its failure
                outcomes.append(analyse_one(settings, spec, remedies, key))
        except Exception as exc:  # noqa: BLE001  (one model's failure is reported, the run goes on)
            outcomes.append(exc)
    return outcomes


def _worker(settings: Config, spec: str, remedies: bool, key: Optional[str]) -> Union[ModelReport, BaseException]:
    """:func:`analyse_one` in a worker process; a failure comes back as a picklable exception."""
    import traceback

    try:
        with collections_eased():  # torch imported here, on a worker's first task
            _fresh_random_state()
            return analyse_one(settings, spec, remedies, key)
    except Exception as exc:  # noqa: BLE001
        return WorkerFailure(failure_message(exc),
                             "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


_EASED: list[bool] = []  # set while collections_eased() is active (the outermost one)


@contextlib.contextmanager
def collections_eased() -> Iterator[None]:
    """Spare the analysis the garbage collector's full passes over what lives throughout it.

    Python's cyclic collector now and then scans every object tracked (a full pass): with torch,
    transformers and a model loaded, half a million objects, about 0.15 s a pass on one core, and
    a run makes several (the LLaMA-2-7B config on meta: 8 passes, 1.0 s of its 8 s). torch and
    qlint are imported with the collector paused (imports make next to no garbage cycles), and what
    is alive then, and again once the model is built (:func:`settled`), is frozen (``gc.freeze``):
    left out of later passes, which then scan only what the trace and the analysis make, and
    handed back to the collector when the model is done (``gc.unfreeze``). No object is freed
    later than a full pass would free it except a cycle that became garbage while frozen, which
    the next full pass after the model collects. Nothing here changes what is computed. A process
    that froze objects of its own, or turned the collector off, is left as it is.
    """
    import gc

    if _EASED or gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        import torch  # noqa: F401
        import qlint.analysis  # noqa: F401
    finally:
        gc.enable()
    gc.freeze()
    _EASED.append(True)
    try:
        yield
    finally:
        _EASED.clear()
        gc.unfreeze()


def settled() -> None:
    """What is alive now lives as long as the model (the model, its modules, transformers): frozen
    while :func:`collections_eased` is active, else nothing."""
    if _EASED:
        import gc

        gc.freeze()


_START_STATE: list[Any] = []  # torch's and Python's random state before a worker's first model


def _fresh_random_state() -> None:
    """Every model a worker analyses starts from the random state of a fresh process (the first
    model's), whichever models the worker analysed before it: ``-j N`` gives what ``-j 1`` gives."""
    import random

    import torch

    if not _START_STATE:
        _START_STATE.append((torch.random.get_rng_state(), random.getstate()))
        return
    torch_state, python_state = _START_STATE[0]
    torch.random.set_rng_state(torch_state)
    random.setstate(python_state)


class WorkerFailure(QlintError):
    """A model that failed in a worker process: its one-line message and its traceback as text."""

    def __init__(self, message: str, traceback_text: str) -> None:
        super().__init__(message)
        self.traceback_text = traceback_text

    def __reduce__(self) -> tuple:
        return (WorkerFailure, (str(self), self.traceback_text))


def _failed(spec: str, exc: BaseException, on_failure: Optional[Callable[[str, BaseException], None]]) -> ModelReport:
    if on_failure is not None:
        on_failure(spec, exc)
    return ModelReport.failed(spec, failure_message(exc))


def failure_message(exc: BaseException) -> str:
    """One line: a qlint error's own message, else the exception's type and first line."""
    if isinstance(exc, QlintError):
        return str(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"internal error: {type(exc).__name__}: {first}".rstrip(": ")


def _one(settings: Config, spec: str, *, remedies: bool) -> ModelReport:
    from qlint.analysis import run
    from qlint.ci.identity import attribute_to_repository
    from qlint.core.results import Source
    from qlint.loader import ModelExit, current_phase, exit_message, note_phase

    loaded, options = prepare(settings, spec, remedies=remedies)
    settled()
    try:
        note_phase("tracing the model (running its forward)")
        analysis = run(loaded.model, loaded.inputs, spec=spec, options=options)
        if loaded.built:
            analysis.report.extra["built"] = loaded.built
        if options.witness:
            from qlint.probe.block_witness import attach as witness

            note_phase("measuring the certified blocks (the witness runs the model's graph)")
            witness(analysis, options.witness_budget)
        if remedies:
            from qlint.remedies import attach

            note_phase("re-checking remedies (running the model's forward)")
            attach(analysis)
    except SystemExit as exc:  # the model's forward called sys.exit(): its failure, not the run's end
        raise ModelExit(f"{spec}: {exit_message(exc, current_phase())}") from None
    return attribute_to_repository(analysis.report, Source(*loaded.origin) if loaded.origin else None)


def prepare(settings: Config, spec: str, *, remedies: bool = False) -> tuple[Any, Any]:
    """Load ``spec`` with the options the configuration gives it, resolved before the model is loaded."""
    from qlint.analysis import load_model

    options = options_for(settings, spec, remedies=remedies)
    return load_model(spec, options), options


def options_for(settings: Config, spec: str, *, remedies: bool = False,
                primitives: Optional[Mapping[Any, Any]] = None) -> Any:
    """The analysis options of ``spec``: its per-model settings, the witness, and the declared primitives
    (``[tool.qlint.primitives]`` and ``primitives=`` keys by class name, matched against the model's classes
    when it is analysed; ``primitives=`` keys that are classes, as they are)."""
    from qlint.analysis import Options, declarations

    model_settings = settings.options_for(spec)
    by_name = {key: _q_and_why(value) for key, value in (primitives or {}).items() if isinstance(key, str)}
    by_class = {key: value for key, value in (primitives or {}).items() if not isinstance(key, str)}
    return Options(
        mode=model_settings.mode,
        tracer=model_settings.tracer,
        device=model_settings.device,
        threshold=model_settings.threshold,
        input_shapes=[",".join(str(d) for d in shape) for shape in model_settings.input_shapes or ()],
        input_dtype=model_settings.input_dtype or "float32",
        remedies=remedies,
        witness=settings.witness,
        witness_budget=settings.witness_budget,
        declared_by_name={**settings.primitives, **by_name},
        primitives=declarations(by_class),
    )


def analyze(model: Any, example_inputs: Optional[tuple] = None, *, spec: Optional[str] = None,
            config: Union[str, Path, None] = None,
            isolated: bool = False, primitives: Optional[Mapping[type, Any]] = None, cwd: Union[str, Path, None] = None,
            **flags: Any) -> ModelReport:
    """Certify every residual block of ``model`` with the project's configuration applied.

    >>> report = qlint.analyze(model, (torch.randn(2, 16, 32),))
    >>> assert report.verdict == "certified", report.findings

    ``primitives={MyGate: {"q": 0, "why": "output in [0, 1]"}}`` declares opaque modules
    for this call only (layered on the configuration's ``[tool.qlint.primitives]``); a
    key may also be a class name as the configuration writes it (``"pkg.mod.MyGate"``).
    """
    from qlint.analysis import run
    from qlint.ci.suppress import apply_suppressions

    settings = configure(None, config=config, isolated=isolated, cwd=cwd, **flags)
    name = spec or type(model).__name__
    options = options_for(settings, name, primitives=primitives)
    analysis = run(model, example_inputs, spec=name, options=options)
    if options.witness:
        from qlint.probe.block_witness import attach as witness

        witness(analysis, options.witness_budget)
    return apply_suppressions([analysis.report], settings)[0]


def probe(specs: Optional[Sequence[str]] = None, *, config: Union[str, Path, None] = None, isolated: bool = False,
          overrides: Iterable[str] = (), cwd: Union[str, Path, None] = None, settings: Any = None,
          on_block: Any = None, **flags: Any) -> list[Any]:
    """``qlint probe``: each spec (or configured model) probed with its ``[tool.qlint]`` settings
    and declared primitives, as :func:`check` analyses it (:mod:`qlint.probe.measure`), with the
    init logs QL401-QL405 among its findings (:mod:`qlint.probe.logs`)."""
    from qlint.probe import logs
    from qlint.probe.measure import ProbeSettings, probe_model

    extra = {"on_block": on_block} if on_block is not None else {}
    results = []
    with model_code():
        for spec, loaded, options in _configured_models(specs, config, isolated, overrides, cwd, flags):
            with model_code(spec, "probing the model (running its blocks)"):
                result = probe_model(loaded.model, loaded.inputs, spec=spec, options=options,
                                     settings=settings or ProbeSettings(), **extra)
            logs.attach(result)
            results.append(result)
    return results


def probe_loops(specs: Optional[Sequence[str]] = None, *, config: Union[str, Path, None] = None, isolated: bool = False,
                overrides: Iterable[str] = (), cwd: Union[str, Path, None] = None, settings: Any = None,
                **flags: Any) -> dict[str, list[Any]]:
    """``qlint probe --loop``: every looped recurrence of each model iterated to its fixed point (source 003)."""
    from qlint.probe.loops import LoopSettings
    from qlint.probe.loops import probe_loops as probe_model_loops

    found = {}
    with model_code():
        for spec, loaded, options in _configured_models(specs, config, isolated, overrides, cwd, flags):
            with model_code(spec, "probing the model's loops (running them)"):
                found[spec] = probe_model_loops(loaded.model, loaded.inputs, spec=spec, options=options,
                                                settings=settings or LoopSettings())
    return found


def models_to_run(specs: Optional[Sequence[str]] = None, *, config: Union[str, Path, None] = None,
                  isolated: bool = False,
                  overrides: Iterable[str] = (), cwd: Union[str, Path, None] = None, **flags: Any) -> Config:
    """The configuration of a probe or a coverage run, every option and spec error raised before
    torch is imported (a flag's value, a missing file, a folder given as a spec)."""
    from qlint.loader import LoadError, check_spec

    settings = configure(specs, config=config, isolated=isolated, overrides=overrides, cwd=cwd, **flags)
    if not settings.models:
        raise ConfigError("no models to run: give specs, or list them in [tool.qlint] models = [...]")
    for spec in settings.models:
        try:
            check_spec(spec)
        except LoadError as exc:  # named once, as ModelReport.failure_line names it
            raise LoadError(str(exc) if str(exc).startswith(spec) else f"{spec}: {exc}") from None
    return settings


def _configured_models(specs: Optional[Sequence[str]], config: Any, isolated: bool, overrides: Iterable[str], cwd: Any,
                       flags: dict[str, Any]) -> Iterable[tuple[str, Any, Any]]:
    settings = models_to_run(specs, config=config, isolated=isolated, overrides=overrides, cwd=cwd, **flags)
    for spec in settings.models:
        loaded, options = prepare(settings, spec)
        yield spec, loaded, options


@contextlib.contextmanager
def model_code(spec: str = "", phase: str = "") -> Iterator[None]:
    """Run the model's code in this process with a guard: what it prints goes to stderr (stdout is
    the report's), and a ``sys.exit()`` in it is a :class:`~qlint.loader.ModelExit` naming ``spec``
    and the phase, not the end of the process (``qlint probe``, ``qlint coverage``, the API;
    ``qlint check`` runs models in supervised worker processes instead)."""
    import sys

    from qlint.loader import ModelExit, current_phase, exit_message, note_phase

    if phase:
        note_phase(phase)
    with contextlib.redirect_stdout(sys.stderr):
        try:
            yield
        except SystemExit as exc:
            message = exit_message(exc, current_phase() or "running the model")
            raise ModelExit(f"{spec}: {message}" if spec else message) from None


def _q_and_why(value: Any) -> tuple[float, str]:
    return (value.q, value.why) if hasattr(value, "why") else (float(value["q"]), str(value["why"]))


__all__ = ["analyze", "analyse_configured", "check", "configure", "model_code", "models_to_run", "prepare", "probe",
           "probe_loops"]
