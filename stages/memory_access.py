"""Stage 4, memory_access: coalesced access, contiguous last dimension, int64 offsets where sizes need them.

Owns: this stage's goal, its detectors and its tactic (analysis and codemod in :mod:`xeforge.rewrite.memory`):

- ``uncoalesced``: a load or store whose fast-moving tile dimension has a non-unit stride (a weight used as
  ``W^T`` through ``w.stride(0)``, a transposed K in attention). Reported; the block_io stage's descriptors
  describe such operands as the transposed view.
- ``int32-overflow``: an access whose largest element offset reaches 2**31 at one of the spec's variants
  (forward evaluated statically with the variant's dims).
- tactic ``int64-offsets``: casts the program ids of the affected kernels to int64.
- tactic ``divisibility-hints``: where a stride or a mask bound is a multiple of 16 at some timed shapes and not
  at others (a hidden size of 3000), the launch passes the largest power of two up to 16 that divides it and the
  kernel hints it (:mod:`xeforge.rewrite.align_hints`); Triton itself specializes on 16 only.
"""

from __future__ import annotations

from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic, guarded
from xeforge.rewrite import align_hints, memory
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.tactics import RewriteMemo


def _overflows(ctx: StageContext) -> list[memory.Overflow]:
    try:
        return memory.overflows(ctx.model, ctx.problem)
    except NotApplicable:
        return []


class Int64Offsets(Tactic):
    name = "int64-offsets"
    summary = "cast program ids to int64 in kernels whose offsets can reach 2**31 at the spec's largest shapes"

    def _plan(self, ctx: StageContext) -> tuple[list[str], list[memory.Overflow]]:
        found = _overflows(ctx)
        if not found:
            variants = ", ".join(ctx.problem.spec.variants)
            raise NotApplicable(f"no access can reach 2**31 elements at the spec's variants ({variants})")
        kernels = list(dict.fromkeys(o.kernel for o in found if o.pid_driven))
        if not kernels:
            raise NotApplicable("offsets overflow only through loop indices or strides, not the program id: "
                                + "; ".join(o.message() for o in found))
        return kernels, found

    def check(self, ctx: StageContext) -> Applicability:
        try:
            kernels, found = self._plan(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, f"{', '.join(kernels)}: " + "; ".join(o.message() for o in found))

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            kernels, found = self._plan(ctx)
        except NotApplicable:
            return []
        src, done = ctx.source, []
        for k in kernels:
            try:
                src = memory.int64_program_ids(src, k)
                done.append(k)
            except NotApplicable:
                continue
        if not done:
            return []
        rest = [o.message() for o in found if not o.pid_driven]
        desc = f"int64 program ids in {', '.join(done)}" + (f" (still int32: {'; '.join(rest)})" if rest else "")
        return [Candidate(src, self.name, desc, params={"kernels": done})]


class DivisibilityHints(Tactic):
    name = "divisibility-hints"
    summary = ("tell the compiler the power of two that divides a stride or a mask bound Triton's 16-only "
               "specialization misses at some timed shapes (a hidden size of 3000), passed per call")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    @staticmethod
    def _build(ctx: StageContext) -> tuple[str, list[align_hints.HintPlan]]:
        plans = align_hints.plan(ctx.source, align_hints.findings(ctx.problem, ctx.source))
        src = ctx.source
        for p in plans:
            src = align_hints.apply(src, p)
        return src, plans

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plans = self._memo.get(ctx, self._build)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, "; ".join(p.describe() for p in plans))

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plans = self._memo.get(ctx, self._build)
        except NotApplicable:
            return []
        # every timed shape: the hints change the code only where a value is not a multiple of 16
        return [Candidate(src, self.name, "; ".join(p.describe() for p in plans),
                          params={"kernels": [p.kernel for p in plans]}, time_all_shapes=True)]


@guarded("memory_access")
def _detect_uncoalesced(ctx: StageContext) -> list[Issue]:
    return [Issue("memory_access", "uncoalesced", u.message(), u.line) for u in memory.uncoalesced(ctx.model)]


@guarded("memory_access")
def _detect_overflow(ctx: StageContext) -> list[Issue]:
    return [Issue("memory_access", "int32-overflow", o.message(), o.line) for o in _overflows(ctx)]


STAGE = Stage(
    name='memory_access',
    order=4,
    goal='coalesced access, contiguous last dimension, int64 offsets where sizes need them',
    kb_topics=('memory', 'coalescing', 'int64'),
    tactics=[Int64Offsets(), DivisibilityHints()],
    detectors=[_detect_uncoalesced, _detect_overflow],
)
