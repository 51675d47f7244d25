"""Stage 6, persistent: the row-sync tactic (a split row reduction finished inside its persistent GEMM).

Owns: the ``row-sync`` tactic. Where the fusion stage split a row reduction read back by every element (``y -
y.mean(1, keepdim=True)``, ``exp(y - y.amax(1, keepdim=True))``) over a GEMM's column tiles, the GEMM stores its
tile and partials and a generated kernel reads the tile back: a second pass over the output. Once the GEMM is a
persistent tile loop (this stage's first tactic), :mod:`xeforge.rewrite.rowsync` has the tiles of a row of tiles wait
for each other's partials and write their finished tiles from registers, under a cooperative launch: the output is
written once. On CUDA only: the wait needs every program of the grid running at once, which the CUDA launcher
guarantees (``launch_cooperative_grid``) and the knowledge base does not know for XPU; the CPU interpreter runs the
candidate's two-pass path (it runs programs one at a time), so there it is checked for correctness only. The
verifier times it against the two passes.
"""

from __future__ import annotations

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.rewrite import NotApplicable, rowsync
from xeforge.rewrite.tiling.configs import kb_errors
from xeforge.rewrite.tiling.tactics import RewriteMemo

TACTIC = "row-sync"


class RowSync(Tactic):
    name = TACTIC
    summary = ("finish a split row reduction in its persistent GEMM: the tiles of a row wait for each other's "
               "partials (cooperative launch), so the output is written once, not written and read back")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _build(self, ctx: StageContext) -> tuple[str, rowsync.SyncPlan]:
        kind = getattr(ctx.device, "kind", "")
        if kind == "xpu":
            raise NotApplicable("the tiles' wait needs every program running at once: CUDA's cooperative launch "
                                "guarantees it; the knowledge base has no such fact for XPU")
        plan = rowsync.plan(ctx.source)
        src = rowsync.apply(ctx.source, plan)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"the synchronised kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return src, plan

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan = self._memo.get(ctx, self._build)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        note = "" if getattr(ctx.device, "can_time", False) else \
            " (on the CPU interpreter the candidate runs its two-pass path: correctness only)"
        return Applicability(True, plan.describe() + note)

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan = self._memo.get(ctx, self._build)
        except NotApplicable:
            return []
        return [Candidate(src, self.name, plan.describe(), params={"kernel": plan.gemm, "row_sync": True})]
