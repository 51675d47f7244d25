"""Stage 7, device_tuning: the GROUP_SIZE_M swizzle tactic (grouped tile order for L2 reuse).

Owns: the ``group-swizzle`` tactic. A 2D-tiled kernel on a 2D grid, on a 1D grid whose program id it splits into
the tile indices by ``//`` and ``%`` (row- or column-major), or in a persistent tile loop gets the grouped tile
order of :mod:`xeforge.rewrite.device_tuning.swizzle`; ``GROUP_SIZE_M`` becomes a literal constexpr at
the launch so the launch-parameter search (and the autotuning stage) can tune it. Its starting value comes
from the KB tuning space of the device (the first seed that sets ``group_size_m``, 8 without one). On a GPU
the rewrite is also proposed with the top KB tile configurations. Listed in ``stages/device_tuning.py``
before the launch-parameter search, so the search tunes the swizzled kernel.
"""

from __future__ import annotations

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.rewrite.device_tuning import swizzle
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import describe, kb_errors
from xeforge.rewrite.autotune import with_configs
from xeforge.rewrite.tiling.tactics import RewriteMemo

DEFAULT_GROUP = 8
RETILE_CONFIGS = 2


def group_size(ctx: StageContext) -> tuple[int, str]:
    """GROUP_SIZE_M to start from, and where it came from."""
    if ctx.kb is not None and ctx.device_id:
        try:
            space = ctx.kb.space(ctx.device_id, "gemm", ctx.triton)
        except Exception:  # no gemm space for this device: use the default
            space = None
        if space is not None:
            for seed in space.seeds:
                if seed.get("group_size_m"):
                    return int(seed["group_size_m"]), f"KB {space.id} seed"
            if space.group_size_m:
                values = sorted(space.group_size_m)
                return int(values[len(values) // 2]), f"KB {space.id}"
    return DEFAULT_GROUP, "default"


class GroupedTileOrder(Tactic):
    name = "group-swizzle"
    summary = "visit tiles in groups of GROUP_SIZE_M rows (2D or split 1D grid, persistent loop) so B stays in L2"

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[str, swizzle.SwizzlePlan, str]:
        group, where = group_size(ctx)
        src, plan = swizzle.rewrite(ctx.source, group=group)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"the swizzled kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return src, plan, where

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan, where = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, f"{plan.describe()} ({where})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan, _ = self._rewrite(ctx)
        except NotApplicable:
            return []
        params = {"kernel": plan.kernel, swizzle.PARAM: plan.group}
        out = [Candidate(src, self.name, plan.describe(), params=params)]
        for cfg, tiled in with_configs(ctx, src, plan.kernel, RETILE_CONFIGS):
            out.append(Candidate(tiled, self.name, f"{plan.describe()}; with {describe(cfg)}",
                                 params={**params, **cfg}))
        return out
