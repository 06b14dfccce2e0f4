"""The result of an analysis: plain dataclasses that serialise to the JSON schema.

Everything a formatter, a baseline or a user's test needs is here; nothing here
knows about torch, so the report can be built, compared and printed cheaply.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

from qlint._version import __version__
from qlint.core.algebra import Exponent, format_q

Severity = Literal["error", "warning", "info"]
BlockStatus = Literal["ok", "supercritical", "uncertified"]
Verdict = Literal["certified", "supercritical", "uncertified", "failed"]
Suppression = Literal["noqa", "per-block-ignores", "per-model-ignores", "baseline"]
SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}

# The HTML page a notebook shows for a report. It is drawn on floor 4 (qlint.ci.formats registers its
# ``html`` format here when imported, as qlint.api does), and this floor may not import it.
_html_renderer: Optional[Callable[[Report], str]] = None


def set_html_renderer(renderer: Callable[[Report], str]) -> None:
    """Make ``renderer`` draw ``Report._repr_html_`` and ``ModelReport._repr_html_``."""
    global _html_renderer
    _html_renderer = renderer


def _repr_html(report: Report) -> str:
    """The registered HTML page, or the verdict per model as preformatted text when none is."""
    if _html_renderer is not None:
        return _html_renderer(report)
    lines = [f"{m.spec}: {m.verdict}, max q = {format_q(m.max_q)}" for m in report.models]
    return "<pre>" + html.escape("\n".join(lines)) + "</pre>"


@dataclass(frozen=True)
class Source:
    """A place in the user's code: the file and line a node was created from."""

    file: str
    line: int

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _json_q(q: Exponent) -> Optional[float]:
    """JSON has no infinity: a non-polynomial or unknown exponent is null."""
    if q is None or math.isinf(q):
        return None
    return q


@dataclass
class DerivationStep:
    """One node along which a block's exponent accumulated."""

    node: str
    primitive: str
    q: Exponent
    source: Optional[Source] = None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "primitive": self.primitive,
            "q": _json_q(self.q),
            "source": self.source.to_dict() if self.source else None,
            "why": self.why,
        }


@dataclass
class Block:
    """One residual update X_{k+1} = F(X_k) and the exponent of its velocity F - id.

    ``form`` is ``additive`` for X + v(X) (q is that of v), ``scaled`` for any other join
    (alpha X + f(X), lerp: q <= max(1, q(F))), or ``post-norm`` / ``post-activation`` when
    the join is followed by a norm / ReLU of the block's own module (LN(X + f(X))) or its skip
    carries a norm of X (a LN(X) + f(LN(X))). A post-norm block's q is its stream map's,
    max(1, q(F)): 1 behind a norm that bounds F (Theorem 9(v)).
    """

    name: str
    index: int
    q: Exponent
    status: BlockStatus
    derivation: list[DerivationStep]
    dominant: str = ""
    source: Optional[Source] = None
    form: Literal["additive", "scaled", "post-norm", "post-activation"] = "additive"
    unknown_ops: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "index": self.index,
            "q": _json_q(self.q),
            "status": self.status,
            "dominant": self.dominant,
            "form": self.form,
            "source": self.source.to_dict() if self.source else None,
            "derivation": [step.to_dict() for step in self.derivation],
        }
        if self.unknown_ops:
            data["unknown_ops"] = list(self.unknown_ops)
        data.update(self.extra)
        return data


@dataclass
class Transition:
    """The stream ops between blocks (a norm between Post-LN blocks, a downsampling stage),
    with the exponent of the map from the previous blocks' output to the next block's input."""

    name: str
    index: int
    q: Exponent
    status: BlockStatus
    derivation: list[DerivationStep]
    dominant: str = ""
    source: Optional[Source] = None
    unknown_ops: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "index": self.index,
            "q": _json_q(self.q),
            "status": self.status,
            "dominant": self.dominant,
            "source": self.source.to_dict() if self.source else None,
            "derivation": [step.to_dict() for step in self.derivation],
        }
        if self.unknown_ops:
            data["unknown_ops"] = list(self.unknown_ops)
        data.update(self.extra)
        return data


@dataclass
class Finding:
    """A rule violation, ruff-style: a code, a severity and a message about a place."""

    code: str
    severity: Severity
    message: str
    block: Optional[str] = None
    source: Optional[Source] = None
    suppression: Optional[Suppression] = None  # set on the findings in ModelReport.suppressed
    related: tuple[Source, ...] = ()  # other lines the message names (the dominant op's), noqa may go there too

    def to_dict(self) -> dict[str, Any]:
        data = {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "block": self.block,
            "source": self.source.to_dict() if self.source else None,
        }
        if self.related:
            data["related"] = [s.to_dict() for s in self.related]
        if self.suppression is not None:
            data["suppression"] = self.suppression
        return data


@dataclass
class ModelReport:
    """Everything qlint found about one model."""

    spec: str
    tracer: str
    mode: Literal["train", "eval"]
    blocks: list[Block]
    findings: list[Finding] = field(default_factory=list)
    threshold: float = 1.0
    transitions: list[Transition] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)  # why part of the stream is outside the analysis
    extra: dict[str, Any] = field(default_factory=dict)
    suppressed: list[Finding] = field(default_factory=list)  # by noqa, per-block-ignores or the baseline
    failure: Optional[str] = None  # why qlint could not analyse this model (exit 2)
    # module class path of each block / finding place ("" -> the model's class): a finding's
    # identity that survives renamed attributes and inserted layers (qlint.ci.identity)
    anchors: dict[str, str] = field(default_factory=dict)

    @classmethod
    def failed(cls, spec: str, reason: str) -> "ModelReport":
        """The report of a model qlint could not load, trace or analyse."""
        return cls(spec=spec, tracer="", mode="eval", blocks=[], failure=reason)

    def failure_line(self) -> str:
        """``"spec: why it failed"``, naming the spec once (load errors already name it)."""
        reason = self.failure or ""
        return reason if reason.startswith(self.spec) else f"{self.spec}: {reason}"

    @property
    def max_q(self) -> Exponent:
        """max_k q_k over the blocks, and over every transition that is not certified (None when one
        of them is not known): a supercritical stem or head is never summarised as the blocks' max q,
        while a certified stem's linear q = 1 is no velocity exponent."""
        parts = [*self.blocks, *(t for t in self.transitions if t.status != "ok")]
        if not self.blocks or any(p.q is None for p in parts):
            return None
        return max(p.q for p in parts)  # type: ignore[type-var]

    @property
    def share_q1(self) -> Optional[float]:
        """|S_1| / D: the share of blocks at exactly q = 1 (paper Section 4.2)."""
        if not self.blocks:
            return None
        return sum(1 for b in self.blocks if b.q == 1) / len(self.blocks)

    @property
    def verdict(self) -> Verdict:
        """certified only when every block and transition was found and bounded (fail closed).

        Suppressing a finding accepts it for the gate; it does not change what was proved,
        so the verdict stays (the report counts what is suppressed beside it).
        """
        if self.failure is not None:
            return "failed"
        parts = [*self.blocks, *self.transitions]
        if self.uncovered or not self.blocks or any(p.status == "uncertified" for p in parts):
            return "uncertified"
        if any(p.status == "supercritical" for p in parts):
            return "supercritical"
        return "uncertified" if self.conditions else "certified"

    @property
    def unchecked(self) -> list[str]:
        """The checks this run did not give the graph: against the model (meta tensors, no example inputs),
        the witness (``--no-witness``, meta weights). A verdict line names them; no summary says "All
        checks passed" over them."""
        out = []
        if str(self.extra.get("graph_check", "")).startswith("not compared"):
            out.append(f"graph against the model ({self.extra['graph_check'][len('not compared: '):]})")
        witness = self.extra.get("witness")
        if witness is None and self.failure is None:
            out.append("witness (off)")
        elif witness is not None and witness.startswith("not run") and "no certified block" not in witness:
            out.append(f"witness ({witness[len('not run: '):]})")
        return out

    @property
    def conditions(self) -> list[dict[str, Any]]:
        """What the forward reads from the process around it that qlint cannot try every value of (an
        environment variable, a thread-local flag: QL109) in the model's own code: a certificate holds
        for those values only, so the verdict is uncertified ("certified for: ..." beside it)."""
        return list(self.extra.get("conditions", []))

    def _repr_html_(self) -> str:
        """The HTML report of this model alone (Jupyter calls this)."""
        return _repr_html(Report([self]))

    def block(self, name: str) -> Block:
        """The block with this name (KeyError if none): handy in users' tests."""
        for candidate in self.blocks:
            if candidate.name == name:
                return candidate
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "spec": self.spec,
            "tracer": self.tracer,
            "mode": self.mode,
            "verdict": self.verdict,
            "max_q": _json_q(self.max_q),
            "share_q1": self.share_q1,
            "threshold": self.threshold,
            "blocks": [b.to_dict() for b in self.blocks],
            "transitions": [t.to_dict() for t in self.transitions],
            "uncovered": list(self.uncovered),
            "findings": [f.to_dict() for f in self.findings],
            "suppressed": [f.to_dict() for f in self.suppressed],
        }
        if self.failure is not None:
            data["failure"] = self.failure
        data.update(self.extra)
        return data


@dataclass
class Report:
    """A run over one or more models."""

    models: list[ModelReport]
    baseline: Optional[str] = None  # the baseline file applied, if any
    stale_baseline: list[dict[str, Any]] = field(default_factory=list)  # its entries that matched nothing
    from_cache: frozenset[str] = frozenset()  # the specs replayed from the result cache (not in the JSON)

    @property
    def findings(self) -> list[Finding]:
        return [f for m in self.models for f in m.findings]

    @property
    def suppressed(self) -> list[Finding]:
        return [f for m in self.models for f in m.suppressed]

    @property
    def failures(self) -> list[ModelReport]:
        """The models qlint could not analyse: the run exits 2 after reporting the others."""
        return [m for m in self.models if m.failure is not None]

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    def _repr_html_(self) -> str:
        """The HTML report (``--output-format html``); Jupyter calls this."""
        return _repr_html(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "qlint_version": __version__,
            "models": [m.to_dict() for m in self.models],
            "summary": {
                "models": len(self.models),
                "errors": self.count("error"),
                "warnings": self.count("warning"),
                "infos": self.count("info"),
                "suppressed": len(self.suppressed),
                "failed": len(self.failures),
                **({"stale_baseline": sum(e.get("count", 1) for e in self.stale_baseline)} if self.baseline else {}),
            },
        }
