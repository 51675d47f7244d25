"""Stage 7, device_tuning: the swap-ab tactic (a GEMM's tile computed transposed, for few rows).

Owns: the ``swap-ab`` tactic. The GEMM launch the stage tunes (the launch-parameter search's target) gets its tile
computed as ``C^T = B^T A^T`` (:mod:`xeforge.rewrite.device_tuning.swap_ab`): at decode-sized M the tile's N side
then fills the matrix unit's deep side. Gate 3 times the candidate at every timed shape (``time_all_shapes``), since
it is meant for the small-M shapes and must not lose at the large ones; on a device that can time also re-tiled with
the KB's top tiles for the device. Listed before the per-shape configurations, so that a swapped kernel that wins is
the one whose tiles the dispatch then picks per shape class.
"""

from __future__ import annotations

from typing import Callable

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.kernel_model import KernelModel, LaunchSite
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.autotune import with_configs
from xeforge.rewrite.device_tuning.swap_ab import SwapPlan, swap_ab
from xeforge.rewrite.tiling.configs import describe, kb_errors
from xeforge.rewrite.tiling.tactics import RewriteMemo

RETILE_CONFIGS = 2


class SwapAB(Tactic):
    name = "swap-ab"
    summary = "compute a GEMM's tile transposed (C^T = B^T A^T): N on the matrix unit's deep side when M is small"

    def __init__(self, target: Callable[[KernelModel], LaunchSite | None]) -> None:
        self._target = target
        self._memo = RewriteMemo()

    def _build(self, ctx: StageContext) -> tuple[str, SwapPlan]:
        site = self._target(ctx.model)
        if site is None:
            raise NotApplicable("no GEMM launch to tune")
        src, plan = swap_ab(ctx.source, site.kernel)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"the swapped kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return src, plan

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan = self._memo.get(ctx, self._build)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, plan.describe())

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan = self._memo.get(ctx, self._build)
        except NotApplicable:
            return []
        params = {"kernel": plan.kernel, "swap_ab": True}
        out = [Candidate(src, self.name, plan.describe(), params=params, time_all_shapes=True)]
        for cfg, tiled in with_configs(ctx, src, plan.kernel, RETILE_CONFIGS):
            out.append(Candidate(tiled, self.name, f"{plan.describe()}; with {describe(cfg)}",
                                 params={**params, **cfg}, time_all_shapes=True))
        return out
