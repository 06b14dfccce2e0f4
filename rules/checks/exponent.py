"""QL1xx: the input-magnitude exponent of each residual block (paper 000)."""

from qlint.rules.checks import Rule, define

SUPERCRITICAL = define(
    Rule(
        code="QL101",
        name="supercritical-block",
        severity="error",
        summary="""
            A residual block X_{k+1} = X_k + v(X_k) whose velocity v grows faster than
            linearly in its input: ||v(x)|| <= c*||x||**q + b only holds with q > 1.
        """,
        rationale="""
            At q > 1 the velocity class contains fields whose forward trajectory blows
            up in finite time (paper 000, Section 2.1, eq. 6); the optimal-control optimum
            is bang-bang and saturates that bound (Theorem 1), so training can select such
            a field. At q <= 1 the forward state and the backward Jacobian stay bounded
            (Theorems 5 and 7). In the reference experiments the free-velocity Mamba
            (q = 5) diverged in 48 of 72 runs; every q <= 1 variant trained stably.
        """,
        example="""
            class Block(nn.Module):          # native Mamba, no normalization: q = 5
                def forward(self, x):
                    return x + self.mixer(x)
        """,
        remedy="""
            Collapse the exponent with a normalization (Theorem 9(v)), or replace the
            highest-q primitive by a Lipschitz substitute:

                return x + self.mixer(self.norm(x))      # Pre-LN / RMSNorm: q = 0

            For selective SSMs, L2-normalise the selective-parameter input and use a
            sigmoid gate (the linear-growth modification, q = 1). `qlint --show-remedies`
            proposes changes it has re-checked.
        """,
    )
)

UNCERTIFIED = define(
    Rule(
        code="QL102",
        name="uncertified-block",
        severity="error",
        summary="""
            A residual block contains an operation whose growth qlint cannot bound:
            an op outside the primitive registry, or a division by an input-dependent
            value that may approach zero.
        """,
        rationale="""
            Certification is only as strong as its weakest primitive (paper 000,
            Section 4.2: decompose the block into primitives of Table 1). An op with no
            known exponent is never treated as safe.
        """,
        example="""
            def forward(self, x):
                return x + self.proj(torch.special.i0(self.fc(x)))
        """,
        remedy="""
            Declare the op's exponent if you can justify it:

                [tool.qlint.primitives]
                "mypkg.layers.MyGate" = { q = 0, why = "output in [0, 1]" }

            or wrap it in a normalization, or replace it by a registered primitive.
        """,
    )
)

SUPERPOLYNOMIAL = define(
    Rule(
        code="QL103",
        name="superpolynomial-growth",
        severity="error",
        summary="""
            A residual block grows faster than any polynomial: exp, sinh or cosh of an
            argument that is not bounded above.
        """,
        rationale="""
            Such a map is outside the primitive set P of paper 000 (Definition 2, Remark
            10): no exponent q bounds it, so the forward state can overflow after a single
            block. A bounded argument (e.g. exp(-softplus(.)*exp(A_log)), Mamba's
            discretisation) is fine and is recognised.
        """,
        example="""
            def forward(self, x):
                return x + self.out(torch.exp(self.fc(x)))
        """,
        remedy="""
            Bound the argument (exp(-softplus(z)), tanh-capping) or normalise the output:

                return x + self.out(torch.exp(-F.softplus(self.fc(x))))
        """,
    )
)

POST_LN = define(
    Rule(
        code="QL104",
        name="post-norm-update",
        severity="info",
        summary="""
            A Post-LN update X_{k+1} = LN(X_k + f(X_k)): the outer normalization resets
            the state at every layer.
        """,
        rationale="""
            The forward and backward bounds of paper 000 (Remark 11) use the additive
            update; Post-LN departs from it and lies outside the analysis. The reported q
            is that of f alone. Post-LN stacks also route the gradient through LN on the
            identity path and usually need learning-rate warmup (source 001, Part IV).
        """,
        example="""
            def forward(self, x):
                return self.norm(x + self.attn(x))
        """,
        remedy="""
            Prefer Pre-LN (x + f(LN(x))) or Peri-LN (x + LN(f(LN(x)))), which keep the
            additive update and give q = 0.
        """,
    )
)

POST_ACTIVATION = define(
    Rule(
        code="QL105",
        name="post-activation-update",
        severity="info",
        summary="""
            A residual update followed by a ReLU, X_{k+1} = relu(X_k + f(X_k)), as in
            the original ResNet.
        """,
        rationale="""
            ReLU is 1-Lipschitz with relu(0) = 0, hence norm-nonexpansive:
            ||relu(z)|| <= ||z||. The forward bound of paper 000 (Theorem 5, Remark 11)
            holds for X_k + f(X_k) and the ReLU cannot increase it, so the block is
            certified with the q of f. Reported for information only.
        """,
        example="""
            def forward(self, x):
                return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))
        """,
        remedy="""
            Nothing to change. Pre-activation ResNets (x + f(relu(bn(x)))) keep the
            plain additive update.
        """,
    )
)
