"""Stage 7, device_tuning: the split-reduction tactic (more programs for a kernel whose few programs each run a long
reduction loop).

Owns: the ``split-reduction`` tactic and its sizing. A launched kernel whose programs leave the device's cores idle
at the spec's bench variant, and whose loop carries a running max, sums and sums rescaled by that max (a
cross-entropy or a softmax over a long row, decode attention over a long cache), is rewritten by
:mod:`xeforge.rewrite.device_tuning.splitred`: SPLIT programs per program over slices of the loop, and a second
kernel that combines their partial states in slice order and runs the rest of the kernel. SPLIT is drawn from
:data:`~xeforge.rewrite.device_tuning.splitred.SPLITS` (at most 4 programs a core, at least 2 loop steps a slice);
the default is the smallest that gives every core a program. On a GPU each value is a candidate for gate 3; the
interpreter gets one (correctness only), sized from the KB device named with ``--target`` when there is one, else
SPLIT=2. For a class of smaller shapes (16 tokens, batch 1) the per-shape-config tactic proposes the same rewrite
in that class's branch only. GEMMs are split-K's: a kernel split-K fits is left to it.
"""

from __future__ import annotations

from stages.base import Applicability, Candidate, StageContext, Tactic
from stages.device_tuning_splitk import INTERPRETER_SPLIT, bench_variant, core_count
from xeforge.analysis.launches import live_launches
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning import splitk, splitred
from xeforge.rewrite.tiling.configs import kb_errors
from xeforge.rewrite.tiling.tactics import RewriteMemo


class SplitReduction(Tactic):
    name = "split-reduction"
    summary = ("SPLIT programs per program over slices of a long reduction loop (a running max, sums, sums "
               "rescaled by the max), combined in order by a second kernel, when a kernel's programs leave cores idle")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[splitred.Plan, list[tuple[int, str, str]]]:
        reasons = []
        try:
            gemm = splitk.find(ctx.source, ctx.problem).kernel
        except NotApplicable:
            gemm = None
        for kernel in dict.fromkeys(s.kernel for s in live_launches(ctx.model)):
            if kernel == gemm:
                reasons.append(f"{kernel} is a GEMM split-K fits")
                continue
            try:
                return self._sized(ctx, splitred.find(ctx.source, kernel))
            except NotApplicable as exc:
                reasons.append(str(exc))
        raise NotApplicable("; ".join(reasons) or "no kernel is launched")

    def _sized(self, ctx: StageContext, plan: splitred.Plan) -> tuple[splitred.Plan, list[tuple[int, str, str]]]:
        variant = bench_variant(ctx)
        programs, steps = splitred.sizes(ctx.source, plan, ctx.problem, variant)
        at = f"at {variant.name}"
        cores, source = core_count(ctx)
        interpreter = not getattr(ctx.device, "can_time", False)
        if cores is None and not interpreter:
            raise NotApplicable(f"{plan.kernel}: {programs} program(s) {at}, but the device's core count is unknown "
                                "(name a knowledge-base device with --target)")
        if cores is not None and programs >= cores:
            raise NotApplicable(f"{plan.kernel}: {programs} programs {at} already fill the {cores} cores ({source})")
        values = splitred.split_values(programs, steps, cores) if cores else [INTERPRETER_SPLIT]
        if not values:
            raise NotApplicable(f"{plan.kernel}: no SPLIT in {splitred.SPLITS} keeps {splitred.MIN_STEPS}+ loop steps "
                                f"a slice ({steps} steps {at})")
        values = values[:1] if interpreter else values[:max(1, ctx.settings.tuning_budget if ctx.settings else 2)]
        length = f"{steps} loop steps" if steps is not None else "a loop whose length is read from memory"
        out, bad = [], []
        for s in values:
            src = splitred.apply(ctx.source, plan, s)
            errors = kb_errors(ctx, src)
            if errors:
                bad.append(f"SPLIT={s}: {'; '.join(errors)}")
                continue
            why = (f"{programs} programs and {length} {at} for {cores} cores ({source}) -> {programs * s} programs"
                   if cores else f"{programs} programs, {length} {at}; no core count on the interpreter, so this only "
                   "checks the rewrite")
            out.append((s, src, why))
        if not out:
            raise NotApplicable(f"the split kernels break KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return plan, out

    def check(self, ctx: StageContext) -> Applicability:
        try:
            plan, out = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, f"{plan.describe()}; SPLIT {', '.join(str(s) for s, _, _ in out)} ({out[0][2]})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            plan, out = self._rewrite(ctx)
        except NotApplicable:
            return []
        return [Candidate(src, self.name, f"{plan.describe(s)}: {why}", kind="rewrite" if i == 0 else "search",
                          params={"kernel": plan.kernel, splitred.PARAM: s}, time_all_shapes=True)
                for i, (s, src, why) in enumerate(out)]
