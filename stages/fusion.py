"""Stage 3, fusion: fewer launches and round trips: epilogues into the GEMM, elementwise chains, torch ops in forward into the kernel.

Owns: this stage's goal, its issue detectors and five deterministic tactics, codemods from
:mod:`xeforge.rewrite.fusion.rewrites`, tried in this order:

- ``fuse-epilogue``: trailing elementwise torch ops in ``Model.forward`` (add, sub, mul, div, relu,
  leaky_relu, sigmoid, silu, tanh, gelu, hardtanh, clamp, mish, softplus, exp, log, min/max with scalars,
  bias and per-column vectors, tensors of the output's shape (a residual), inference batch_norm; see
  :mod:`xeforge.rewrite.fusion.tl_ops`; ``torch.where`` and comparisons) run in the kernel's epilogue, the
  return's own expression included; a final ``.to(dtype)`` becomes the output buffer's dtype. The ops may form a
  graph over the output: an earlier value read again (``original = y.clone()`` ... ``y + original``, a gate's
  input) stays in a tl variable, ``clone``/``detach``/``contiguous`` are the value they copy, and an in-place op
  (``y.mul_(s).add_(y0)``) is the op assigning its receiver.
- ``fuse-elementwise-chain``: an elementwise Triton kernel (or a chain of them) that reads exactly the tile
  another kernel wrote runs inside the producer, before its one store.
- ``fuse-row-reduction``: a row reduction after a 2D-tiled kernel (sum/mean/max/min/logsumexp over the
  last dim, with elementwise ops around it) when one tile can cover the row at the spec's shapes.
- ``fuse-split-row-reduction``: the same when no tile covers the row (sum/max/min/logsumexp): each tile
  writes its row partial into a small buffer, forward's reduction runs on the partials (same torch call).
  In the chain, that reduction and the small ops after it (further reductions over the size-1 dim it kept
  are the identity; ops with a per-column vector, which broadcast the rows to the full width) become one
  generated kernel (:mod:`xeforge.rewrite.fusion.combine`).
- ``fuse-group-norm``: ``F.group_norm`` on a (rows, channels) tensor and the elementwise ops after it become
  one generated kernel, one program per row and block of groups. Every fusion tactic whose chain of rewrites
  reaches a GroupNorm proposes that chain first with the fp32 buffer the GroupNorm reads allocated in the
  module's result dtype (what the reference computes), then as is.

The rewrites edit ``forward``'s own statements. When a launch sits behind a call (a module-level wrapper, a
launcher object's method, ``torch.autograd.Function.apply``, a ``torch.library`` op), each tactic first inlines the
calls leading to it into ``forward`` (:mod:`xeforge.rewrite.fusion.inline`; the description says what was inlined and
what that drops, such as the Function's backward), then fuses; a call that cannot be inlined is named with its
construct and line.

Each tactic's candidate is its rewrite followed by whatever other fusion then applies (torch ops fused
first can make a consumer kernel adjacent to its producer); the single-step rewrite is proposed as a
fallback. Shapes none of them covers are reported as "no fusion tactic applies: <reason>".
"""

from __future__ import annotations

import ast

from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.fusion import rewrites as fr
from xeforge.rewrite.fusion import inline
from xeforge.rewrite.context import Ctx, guarded, memo_key
from xeforge.rewrite.fusion.tile import tile_store
from xeforge.static_checks import torch_compute_calls

NOT_APPLICABLE = "no fusion tactic applies: "


class FusionTactic(Tactic):
    """One fusion rewrite (``first``) and its follow-ups."""

    first = ""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], list[tuple[str, str]] | str] = {}

    def _compute(self, ctx: StageContext) -> list[tuple[str, str]]:
        try:
            return self._fusions(ctx.source, ctx.problem)
        except NotApplicable as direct:
            # the launch may be in a wrapper, a method, an autograd Function or a torch.library op: inline the
            # calls that lead to it into forward, then fuse there (the reason names the call that cannot be)
            alone = _one_kernel_and_nothing_after(ctx)
            if alone:  # whether the wrapper can be inlined, or its store read, does not matter: nothing to fuse
                raise NotApplicable(alone) from None
            inlined = inline.into_forward(ctx.source)
            if inlined is None:
                raise direct
            source, notes = inlined
            try:
                fused = self._fusions(source, ctx.problem)
            except NotApplicable as exc:
                raise NotApplicable(f"{'; '.join(notes)}; then: {exc}") from None
            return [(src, "; ".join([*notes, desc])) for src, desc in fused]

    def _fusions(self, source: str, problem) -> list[tuple[str, str]]:
        single, desc = fr.REWRITES[self.first](source, problem)
        out = [(single, desc)]
        full, steps = fr.fuse_all(source, problem, self.first)
        if full != single:
            out.insert(0, (full, "; then ".join(steps)))
        # first of all: a GroupNorm on the way reads the fp32 buffer before it in the result's dtype (half the traffic)
        narrowed, nsteps = fr.fuse_all(source, problem, self.first, narrow=True)
        if narrowed != full:
            out.insert(0, (narrowed, "; then ".join(nsteps)))
        return out

    def results(self, ctx: StageContext) -> list[tuple[str, str]] | str:
        """[(source, description)] — the fused-as-far-as-possible result first — or why nothing applies."""
        key = memo_key(ctx)
        if key not in self._memo:
            self._memo[key] = guarded(lambda: self._compute(ctx))
            if len(self._memo) > 32:
                self._memo.pop(next(iter(self._memo)))
        return self._memo[key]

    def check(self, ctx: StageContext) -> Applicability:
        r = self.results(ctx)
        if isinstance(r, str):
            return Applicability(False, NOT_APPLICABLE + r)
        return Applicability(True, r[-1][1])

    def propose(self, ctx: StageContext) -> list[Candidate]:
        r = self.results(ctx)
        if isinstance(r, str):
            return []
        return [Candidate(src, self.name, desc, kind="rewrite") for src, desc in r]


def _one_kernel_and_nothing_after(ctx: StageContext) -> str | None:
    """Why nothing can be fused, where every trace shows one launch of one kernel and no torch compute after it
    (a norm or an attention call on its own: no epilogue, no consumer kernel); else None."""
    from xeforge.analysis.observe import traces  # lazy: the trace worker is only needed once a rewrite fails
    from xeforge.analysis.trace import Launch

    got = [t for t in traces(ctx.problem, ctx.source).values() if not isinstance(t, str)]
    if not got:
        return None
    for t in got:
        if len(t.launches) != 1:
            return None
        after = t.order[t.order.index(t.launches[0]) + 1:]
        if any(not isinstance(e, Launch) and e.kind == "compute" for e in after):
            return None
    la = got[0].launches[0]
    return (f"forward runs one kernel, {la.kernel} ({la.via()}), and no torch op after it in any traced variant: "
            "nothing to fuse into it")


class FuseEpilogue(FusionTactic):
    name = "fuse-epilogue"
    summary = "translate elementwise torch ops after a launch into tl code in the kernel's epilogue"
    first = "forward-ops"


class FuseElementwiseChain(FusionTactic):
    name = "fuse-elementwise-chain"
    summary = "fold an elementwise kernel that reads exactly another kernel's tile into the producer's store"
    first = "consumer-kernel"


class FuseRowReduction(FusionTactic):
    name = "fuse-row-reduction"
    summary = "fold a row reduction after a GEMM into it when one tile covers the row"
    first = "row-reduction"


class FuseSplitRowReduction(FusionTactic):
    name = "fuse-split-row-reduction"
    summary = "split a row reduction too wide for one tile: per-tile partials in the GEMM, the reduction on them"
    first = "split-row-reduction"


class FuseGroupNorm(FusionTactic):
    name = "fuse-group-norm"
    summary = "run F.group_norm and the elementwise ops after it as one generated kernel (one read, one write)"
    first = "group-norm"


# ------------------------------------------------------------------------------------------------ detectors
def _detect_consumer_kernels(ctx: StageContext) -> list[Issue]:
    try:
        c = Ctx(ctx.source, ctx.problem)
    except NotApplicable:
        return []
    out = []
    written: dict[str, str] = {}  # tensor variable -> kernel that wrote it
    for site in c.model.launches:
        bind = c.env.binding(site)
        for a in bind.values():
            if isinstance(a, ast.Name) and a.id in written and written[a.id] != site.kernel:
                out.append(Issue("fusion", "separate-kernel", f"{site.kernel} re-reads {a.id}, which "
                                 f"{written[a.id]} wrote: one more launch and a round trip through memory", site.line))
                break
        try:
            ts = tile_store(c.parsed, site.kernel)
        except NotApplicable:
            continue
        a = bind.get(ts.ptr_param)
        if isinstance(a, ast.Name):
            written[a.id] = site.kernel
    return out


def _detect_torch_ops(ctx: StageContext) -> list[Issue]:
    m = ctx.model
    if not m.launches:
        return []
    ops = torch_compute_calls(m)
    if not ops:
        return []
    shown = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(ops.items()))
    return [Issue("fusion", "torch-ops-in-forward", f"forward computes with torch around its kernels ({shown}): each op "
                  "is another pass over memory", m.forward().lineno if m.forward() else None)]


STAGE = Stage(
    name='fusion',
    order=3,
    goal='fewer launches and round trips: epilogues into the GEMM, elementwise chains, torch ops in forward into the kernel',
    kb_topics=('fusion',),
    tactics=[FuseEpilogue(), FuseElementwiseChain(), FuseRowReduction(), FuseSplitRowReduction(), FuseGroupNorm()],
    detectors=[_detect_consumer_kernels, _detect_torch_ops],
)
