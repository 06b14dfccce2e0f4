"""QL100: suppression comments that no longer suppress anything (like ruff's RUF100)."""

from qlint.rules.checks import Rule, define

UNUSED_NOQA = define(
    Rule(
        code="QL100",
        name="unused-noqa",
        severity="warning",
        summary="""
            A `# qlint: noqa` comment on a line qlint analysed (the residual add of a
            block) that suppresses nothing: the finding it named is fixed, the code is
            not enabled, or the code does not exist.
        """,
        rationale="""
            A stale suppression hides the next regression on that line: if the block
            is edited back to a supercritical form, the old comment silences QL101
            without anyone reviewing it. Removing unused suppressions keeps every
            remaining one a deliberate, reviewed decision (ruff's RUF100, pylint's
            useless-suppression).
        """,
        example="""
            def forward(self, x):
                return x + self.mlp(self.norm(x))  # qlint: noqa: QL101   (now q = 0)
        """,
        remedy="""
            Delete the comment, or drop the codes that are no longer reported:

                return x + self.mlp(self.norm(x))
        """,
    )
)
