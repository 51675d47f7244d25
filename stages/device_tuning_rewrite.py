"""Stage 7, device_tuning: what the one-rewrite tactics of the GEMM launch share (epilogue-halves, swap-ab).

Owns :class:`GemmRewrite`: the launch the stage tunes (its ``target``) gets one source rewrite (a subclass's
:meth:`~GemmRewrite.rewrite`, with its plan), refused with the reason where it does not apply or breaks the KB's
constraints for the device; the rewrite is proposed as it is, re-tiled with the KB's top configurations on a device
that can time, and with whatever more a subclass adds (:meth:`~GemmRewrite.more`). The rewrite is built once per
incumbent (:class:`~xeforge.rewrite.tiling.tactics.RewriteMemo`).
"""

from __future__ import annotations

from typing import Any, Callable

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.kernel_model import KernelModel, LaunchSite
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.autotune import with_configs
from xeforge.rewrite.tiling.configs import describe, kb_errors
from xeforge.rewrite.tiling.tactics import RewriteMemo


class GemmRewrite(Tactic):
    """One rewrite of the tuned GEMM launch's kernel; the subclass names it and says what its candidates carry."""

    flag = ""  # the params key every candidate carries as True ("swap_ab")
    what = ""  # the rewritten kernel, as the KB refusal names it ("the swapped kernel")
    retile = 1  # KB configurations the rewrite is re-tiled with, on a device that can time
    time_all_shapes = False  # whether gate 3 times the candidates at every timed shape

    def __init__(self, target: Callable[[KernelModel], LaunchSite | None]) -> None:
        self._target = target
        self._memo = RewriteMemo()

    def rewrite(self, ctx: StageContext, site: LaunchSite) -> tuple[str, Any]:
        """(source, plan) for the launch at ``site``; the plan has ``kernel`` and ``describe()``."""
        raise NotImplementedError

    def more(self, ctx: StageContext, src: str, plan: Any) -> list[Candidate]:
        """Further candidates built on the rewrite (none by default)."""
        return []

    def _build(self, ctx: StageContext) -> tuple[str, Any]:
        site = self._target(ctx.model)
        if site is None:
            raise NotApplicable("no GEMM launch to tune")
        src, plan = self.rewrite(ctx, site)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"{self.what} breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
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
        params = {"kernel": plan.kernel, self.flag: True}
        out = [Candidate(src, self.name, plan.describe(), params=params, time_all_shapes=self.time_all_shapes)]
        for cfg, tiled in with_configs(ctx, src, plan.kernel, self.retile):
            out.append(Candidate(tiled, self.name, f"{plan.describe()}; with {describe(cfg)}",
                                 params={**params, **cfg}, time_all_shapes=self.time_all_shapes))
        return out + self.more(ctx, src, plan)
