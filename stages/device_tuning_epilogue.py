"""Stage 7, device_tuning: the epilogue-halves tactic (a GEMM's epilogue on two column halves of its tile).

Owns: the ``epilogue-halves`` tactic (a :class:`~stages.device_tuning_rewrite.GemmRewrite`). The GEMM launch the
stage tunes (the same target as the launch-parameter search) gets its epilogue run on the two ``[BM, BN // 2]``
column halves of the accumulator (:mod:`xeforge.rewrite.device_tuning.epilogue`): fewer live registers after the K
loop, where a heavy epilogue (an exact GELU and a residual read on a 128 x 256 fp32 tile) spills. Whether that wins
is the GPU's to say: on the H200 it did for a GELU + residual epilogue and did not for a row reduction's partials
(which this rewrite refuses anyway), so it is one candidate for gate 3, not a rule. Listed after the
launch-parameter search and the per-shape configurations, so the halves are those of the tile the search chose; on a
GPU also with the KB's top tile and, where the kernel still has one tile per program, inside a persistent tile loop.
"""

from __future__ import annotations

from stages.base import Candidate, StageContext
from stages.device_tuning_rewrite import GemmRewrite
from xeforge.analysis.launches import bindings
from xeforge.kernel_model import LaunchSite
from xeforge.rewrite import NotApplicable, persistent
from xeforge.rewrite.device_tuning.epilogue import EpiloguePlan, split_epilogue
from xeforge.rewrite.tiling.configs import kb_errors

#: the narrowest column block whose halves are worth a second pass over the epilogue
MIN_COLUMNS = 32


class EpilogueHalves(GemmRewrite):
    name = "epilogue-halves"
    summary = "run a GEMM's epilogue on two [BM, BN/2] column halves of its accumulator (fewer live registers)"
    flag, what, retile = "epilogue_halves", "the split epilogue", 1

    def rewrite(self, ctx: StageContext, site: LaunchSite) -> tuple[str, EpiloguePlan]:
        src, plan = split_epilogue(ctx.source, site.kernel)
        if plan.cols.isidentifier():
            value = bindings(ctx.model, site).get(plan.cols)
            width = value.value if value is not None else None
            if isinstance(width, int) and not isinstance(width, bool) and width < MIN_COLUMNS:
                raise NotApplicable(f"{site.kernel} at line {site.line}: {plan.cols}={width}, halves of "
                                    f"{width // 2} columns are too narrow to gain (at least {MIN_COLUMNS})")
        return src, plan

    def more(self, ctx: StageContext, src: str, plan: EpiloguePlan) -> list[Candidate]:
        return self._in_tile_loop(ctx, src, plan)

    def _in_tile_loop(self, ctx: StageContext, src: str, plan: EpiloguePlan) -> list[Candidate]:
        """On a GPU, where the kernel still has one tile per program: the halves inside a persistent tile loop too.
        The two compose: on the H200 (Triton 3.6, GELU + residual epilogue, 2048 x 4096 x 4096 bf16) the tile loop
        alone was within 1% of one tile per program, the tile loop with the halves 0.1142 ms against 0.1211
        (scripts/gemm_epilogue_probe.py); a tile loop the persistent stage rejected may win with them."""
        if not getattr(ctx.device, "can_time", False):
            return []
        try:
            looped, loop = persistent.rewrite(src, kernel=plan.kernel)
        except NotApplicable:  # already persistent, or a grid the tile loop cannot take
            return []
        if kb_errors(ctx, looped):
            return []
        return [Candidate(looped, self.name, f"{plan.describe()}; inside {loop.describe()}",
                          params={"kernel": plan.kernel, "epilogue_halves": True, "persistent": True})]
