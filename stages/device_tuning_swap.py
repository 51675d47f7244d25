"""Stage 7, device_tuning: the swap-ab tactic (a GEMM's tile computed transposed, for few rows).

Owns: the ``swap-ab`` tactic (a :class:`~stages.device_tuning_rewrite.GemmRewrite`). The GEMM launch the stage tunes
(the launch-parameter search's target) gets its tile computed as ``C^T = B^T A^T``
(:mod:`xeforge.rewrite.device_tuning.swap_ab`): at decode-sized M the tile's N side then fills the matrix unit's
deep side. Gate 3 times the candidate at every timed shape (``time_all_shapes``), since it is meant for the small-M
shapes and must not lose at the large ones; on a device that can time also re-tiled with the KB's top tiles for the
device. Listed before the per-shape configurations, so that a swapped kernel that wins is the one whose tiles the
dispatch then picks per shape class.
"""

from __future__ import annotations

from stages.base import StageContext
from stages.device_tuning_rewrite import GemmRewrite
from xeforge.kernel_model import LaunchSite
from xeforge.rewrite.device_tuning.swap_ab import SwapPlan, swap_ab


class SwapAB(GemmRewrite):
    name = "swap-ab"
    summary = "compute a GEMM's tile transposed (C^T = B^T A^T): N on the matrix unit's deep side when M is small"
    flag, what, retile, time_all_shapes = "swap_ab", "the swapped kernel", 2, True

    def rewrite(self, ctx: StageContext, site: LaunchSite) -> tuple[str, SwapPlan]:
        return swap_ab(ctx.source, site.kernel)
