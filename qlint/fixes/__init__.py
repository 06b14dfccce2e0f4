"""Remedies as re-certified patches of the user's source: ``qlint --diff`` / ``--fix`` and
``qlint.remedy(spec, as_patch=True)``.

For each failing block, the remedies that certify it on the graph (:func:`qlint.remedies.propose`,
best first) are written as edits of the file the block's code lives in (:mod:`qlint.fixes.edits`).
A patch is then believed only on the evidence of the patched source itself: the patched files are
written to a temporary folder, a child process imports them in place of the originals and runs
the full analysis of the same spec with the same settings (:mod:`qlint.fixes.recheck`), and the
patch is kept only if the block certifies there and no other block or model verdict got worse.
Patches build on each other, so a block certified by an earlier block's patch (same class) needs
none of its own. Code outside the repository (transformers, timm) is never patched: its blocks
get the reason, and ``--show-remedies`` keeps the prose.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from qlint.core.errors import QlintError


class FixError(QlintError):
    """--diff / --fix cannot run (libcst missing)."""


FUNCTION_PRESERVING: frozenset[str] = frozenset()  # remedy kinds that keep the model's function: none yet


@dataclass(frozen=True)
class Patch:
    """One file's re-certified change: the remedies written into it and the blocks they certify."""

    path: str  # relative to the repository root, as `git apply` reads it
    original: str
    patched: str
    kinds: tuple[str, ...]
    blocks: tuple[str, ...]
    q_after: dict[str, Optional[float]]
    encoding: str = "utf-8"  # the file's own (a coding line); its line endings stay as they are in the text

    @property
    def unsafe(self) -> bool:
        """Whether the patch changes the function the model computes (ruff's unsafe fix): a trained
        checkpoint no longer computes what it did. Every remedy does today (a norm added, a gate or an
        activation replaced); :data:`FUNCTION_PRESERVING` would name one that does not."""
        return any(kind not in FUNCTION_PRESERVING for kind in self.kinds)

    @property
    def diff(self) -> str:
        lines = difflib.unified_diff(_lines(self.original), _lines(self.patched),
                                     fromfile=f"a/{self.path}", tofile=f"b/{self.path}")
        return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": ", ".join(self.kinds), "path": self.path, "diff": self.diff, "blocks": list(self.blocks),
                "q_after": max((q for q in self.q_after.values() if q is not None), default=None)}


def _lines(text: str) -> list[str]:
    """Lines as git counts them: split at "\n" only, each keeping its ending ("\r\n" stays)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def read_source(path: Path) -> tuple[str, str]:
    """A source file's text and encoding (its coding line, else UTF-8), line endings untranslated."""
    raw = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return raw.decode(encoding), encoding


@dataclass
class Fixes:
    """The patches for one spec, and for each block left failing, why it got none."""

    spec: str
    patches: list[Patch] = field(default_factory=list)
    unpatched: dict[str, list[str]] = field(default_factory=dict)
    dropped: dict[str, list[str]] = field(default_factory=dict)  # better-ranked remedies passed over, and why
    prose: dict[str, list[str]] = field(default_factory=dict)  # an unpatched block's graph remedies, as sketches


def repository_root(cwd: Optional[Path] = None) -> Path:
    """The git top level of ``cwd`` (the current folder without git)."""
    cwd = (cwd or Path.cwd()).resolve()
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return cwd
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else cwd


def source_patches(settings: Any, spec: str, root: Optional[Path] = None, analysis: Any = None) -> Fixes:
    """The re-certified patches of ``spec`` under ``settings`` (a :class:`qlint.ci.config.Config`);
    ``analysis``: the spec's analysis when the caller has one already."""
    try:
        import libcst  # noqa: F401
    except ImportError:
        raise FixError("qlint --diff/--fix needs the [fix] extra (libcst is not installed): "
                       "pip install 'torch-qlint[fix]'") from None
    from qlint.fixes.edits import EditError, FileEdit, apply, edits_for
    from qlint.remedies import base_module, propose
    from qlint.remedies.context import BlockContext

    root = root or repository_root()
    if analysis is None:
        from qlint.analysis import run
        from qlint.api import model_code, prepare

        with model_code(spec, f"loading {spec}"):  # its prints go to stderr, a sys.exit() is its error
            loaded, options = prepare(settings, spec)
            analysis = run(loaded.model, loaded.inputs, spec=spec, options=options)
            if options.witness:  # as the re-check will (analyse_one): a refuted block is failing on both sides
                from qlint.probe.block_witness import attach

                attach(analysis, options.witness_budget)
    current = verdicts(analysis.report)
    others = [other for other in getattr(settings, "models", ()) if other != spec]
    # the run's other models, as they are: a patch of a class they share must not make them worse
    around = recheck(settings, others, {}, {}) if others else {}
    base = base_module(analysis)
    fixes = Fixes(spec)
    accepted: dict[Path, FileEdit] = {}  # every edit kept so far, made together on the original text
    originals: dict[Path, str] = {}  # each file as first read: the lines every edit names are its lines
    encodings: dict[Path, str] = {}
    kinds: dict[Path, list[str]] = {}
    blocks: dict[Path, list[str]] = {}
    for block in (b for b in analysis.report.blocks if b.status != "ok"):
        if current["blocks"].get(block.name, (None, ""))[1] == "ok":  # an earlier patch certified it
            continue
        reasons: list[str] = []
        ranked = propose(analysis, block.name, base)
        if not ranked:
            reasons.append("no remedy certifies it on the graph")
        for remedy in ranked:
            try:
                edits = edits_for(BlockContext(analysis, block.name, base), remedy.kind, root)
                trial = {**accepted, **{path: accepted.get(path, FileEdit()) + edit for path, edit in edits.items()}}
                for path in trial:
                    if path not in originals:
                        originals[path], encodings[path] = read_source(path)
                texts = {path: apply(originals[path], edit) for path, edit in trial.items()}
            except EditError as exc:
                reasons.append(f"{remedy.kind}: {exc}")
                continue
            except Exception as exc:  # an edit qlint could not write is a reason, never the end of the run
                reasons.append(f"{remedy.kind}: the edit could not be written ({type(exc).__name__}: {exc})")
                continue
            checked = recheck(settings, [spec, *others], texts, encodings)
            verdict = checked[spec]
            problem = _problem(verdict, current, block.name, settings.fails) or next(
                (f"`{other}` {why}" for other in others
                 if (why := _worse(checked[other], around[other], settings.fails))), None)
            if problem:
                reasons.append(f"{remedy.kind}: {problem}")
                continue
            newly = [name for name, (_, status) in verdict["blocks"].items()
                     if status == "ok" and current["blocks"].get(name, (None, "ok"))[1] != "ok"]
            accepted, current = trial, verdict
            around = {other: checked[other] for other in others}
            if reasons:
                fixes.dropped[block.name] = reasons
            for path in edits:
                kinds.setdefault(path, []).append(remedy.kind)
                blocks.setdefault(path, []).extend(newly)
            break
        else:
            fixes.unpatched[block.name] = reasons
            fixes.prose[block.name] = [f"{remedy.kind} ({remedy.target}): {remedy.sketch}" for remedy in ranked]
    for path, edit in accepted.items():
        names = tuple(dict.fromkeys(blocks[path]))
        fixes.patches.append(Patch(path.relative_to(root).as_posix(), originals[path], apply(originals[path], edit),
                                   tuple(dict.fromkeys(kinds[path])), names,
                                   {name: current["blocks"][name][0] for name in names}, encodings[path]))
    return fixes


def isolated_patches(settings: Any, spec: str, root: Path) -> Fixes:
    """:func:`source_patches` in a child process (:mod:`qlint.fixes.isolated`): the model's code cannot
    end qlint or decide its exit code. FixError when libcst is missing; QlintError naming ``spec`` when
    the model cannot be analysed, or its code ended the child."""
    with tempfile.TemporaryDirectory(prefix="qlint-fix-") as folder:
        job, out = Path(folder) / "job.pickle", Path(folder) / "fixes.pickle"
        job.write_bytes(pickle.dumps({"settings": settings, "spec": spec, "root": root}))
        done = subprocess.run([sys.executable, "-m", "qlint.fixes.isolated", str(job), str(out)],
                              stdout=subprocess.DEVNULL, stderr=None, timeout=3600)
        if done.returncode != 0 or not out.is_file():
            raise QlintError(f"{spec}: the model's code ended the process (exit code {done.returncode})")
        result = pickle.loads(out.read_bytes())
    if isinstance(result, Fixes):
        return result
    kind, message = result
    raise (FixError if kind == "fix" else QlintError)(message)


def attach_patches(model: Any, fixes: Fixes) -> None:
    """``block.extra["patches"]`` of ``model`` (a ModelReport) for each failing block a re-certified
    source patch fixes (``--show-remedies``; the HTML report shows them as diffs)."""
    blocks = {b.name: b for b in model.blocks}
    for patch in fixes.patches:
        for name in patch.blocks:
            if name in blocks:
                blocks[name].extra.setdefault("patches", []).append(patch.to_dict())


def verdicts(report: Any) -> dict:
    """What a re-check is compared on: each block's (q, status), and the findings as (code, severity, block)."""
    return {"blocks": {b.name: (b.q, b.status) for b in report.blocks},  # q: a float, inf, or None (unknown)
            "findings": [(f.code, f.severity, f.block) for f in report.findings]}


def _problem(verdict: dict, before: dict, name: str, fails: Callable[[str], bool]) -> Optional[str]:
    """Why a re-checked patch is not kept, or None: the block must certify and nothing get worse."""
    if verdict["failure"]:
        return f"the patched source does not analyse: {verdict['failure']}"
    q, status = verdict["blocks"].get(name, (None, "missing"))
    if status != "ok":
        return f"the patched source leaves the block at q = {q}" if q is not None else "the block is not certified"
    return _worse(verdict, before, fails)


def _worse(verdict: dict, before: dict, fails: Callable[[str], bool]) -> Optional[str]:
    """How ``verdict`` is worse than ``before``, or None: a model that no longer analyses, a certified block
    that no longer certifies, a failing block whose known q rises, or a new finding that fails the run."""
    if verdict["failure"]:
        return None if before["failure"] else f"would no longer analyse: {verdict['failure']}"
    after = verdict["blocks"]
    for other, (q, status) in before["blocks"].items():
        new_q, new_status = after.get(other, (None, "missing"))
        if status == "ok" and new_status != "ok":
            return f"block `{other}` would no longer certify"
        if status != "ok" and new_status != "ok" and q is not None and (new_q is None or new_q > q):
            return f"block `{other}` would get worse (q = {q} -> {new_q})"
    known = {(code, block) for code, _, block in before["findings"]}
    for code, severity, block in verdict["findings"]:
        if fails(severity) and (code, block) not in known:
            return f"the patched source adds {code}" + (f" on `{block}`" if block else "")
    return None


def recheck(settings: Any, specs: list[str], texts: dict[Path, str], encodings: dict[Path, str]) -> dict:
    """Analyse each of ``specs`` in a child process that imports ``texts`` in place of those files:
    spec -> {"failure": str | None, "blocks": {name: (q, status)}, "findings": [(code, severity, block)]}."""
    with tempfile.TemporaryDirectory(prefix="qlint-fix-") as folder:
        redirects = {}
        for index, (path, text) in enumerate(texts.items()):
            copy = Path(folder) / f"{index}_{path.name}"
            copy.write_bytes(text.encode(encodings.get(path, "utf-8")))
            redirects[str(path)] = str(copy)
        checked = {}
        for index, spec in enumerate(specs):  # a child each: one model's os._exit() ends only its own check
            job, out = Path(folder) / f"job{index}.pickle", Path(folder) / f"verdict{index}.json"
            job.write_bytes(pickle.dumps({"settings": settings, "specs": [spec], "redirects": redirects}))
            env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
            done = subprocess.run([sys.executable, "-m", "qlint.fixes.recheck", str(job), str(out)], env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0 or not out.is_file():
                tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
                checked[spec] = {"failure": f"the re-check ended early: {tail}", "blocks": {}, "findings": []}
            else:
                checked.update(json.loads(out.read_text()))
    for verdict in checked.values():
        verdict["blocks"] = {name: tuple(value) for name, value in verdict["blocks"].items()}
        verdict["findings"] = [tuple(finding) for finding in verdict["findings"]]
    return checked


def write_patch(root: Path, patch: Patch) -> None:
    """Write ``patch`` in one step (a crash leaves the old file or the new, never half), in the file's
    encoding and line endings; FixError when the file changed since qlint read it (your edit wins)."""
    path = root / patch.path
    if read_source(path)[0] != patch.original:
        raise FixError(f"{patch.path} changed while qlint worked on it: not written (run qlint --fix again)")
    mode = path.stat().st_mode
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".qlint")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(patch.patched.encode(patch.encoding))
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def remedy(model: Any, example_inputs: Optional[tuple] = None, *, as_patch: bool = False, **options: Any) -> Any:
    """``qlint.remedy``: the remedied GraphModule (:func:`qlint.remedies.remedy`), or with
    ``as_patch=True`` the re-certified source :class:`Patch` list of ``model`` given as a spec
    (``"path/model.py:build_model"``): a patch is re-checked by rebuilding the model from the
    patched source, which needs the code that builds it, not a built module."""
    if not as_patch:
        from qlint.remedies import remedy as graph_remedy

        return graph_remedy(model, example_inputs, **options)
    if not isinstance(model, str):
        raise ValueError("as_patch=True needs the model as a spec, e.g. qlint.remedy('model.py:build_model', "
                         "as_patch=True): the patched source is re-checked by building the model from it")
    from qlint.api import configure

    flags = {k: options[k] for k in ("mode", "tracer", "threshold") if options.get(k) is not None}
    return source_patches(configure([model], isolated=True, **flags), model).patches
