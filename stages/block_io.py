"""Stage 5, block_io: structured loads — tensor descriptors, or block pointers where the Triton still has them.

Owns: this stage's goal, its detector (GEMM tile loops that load through pointer arithmetic and masks) and
its tactic, which rewrites those loops with :mod:`xeforge.rewrite.blockio`. Which form the rewrite takes
depends on the device, the Triton version and the knowledge base:

- a KB pattern for the device whose tactic is ``keep-pointers`` (Arc A770: no 2D block I/O) stops it;
- tensor descriptors by default; block pointers when a KB pattern prefers them (tactic ``block-pointer``)
  or when the KB's constraints reject descriptors for this Triton (before 3.4) but not block pointers;
- on NVIDIA the rewritten ``forward`` sets Triton's allocator for device-side descriptors (TMA); on Intel
  GPUs it does not (KB ``bio-no-set-allocator-on-xpu``).

On a GPU the rewrite is also proposed with the top KB tile configurations, because descriptors pay off most
with larger tiles, and with the epilogue's rank-2 tile loads (a fused residual) through descriptors too (their
staging buffers cost shared memory); the verifier times each candidate. Where the problem times an odd shape (a
size no tile divides, :func:`xeforge.shape_classes.shape_class`), the first candidate is timed at every shape: the
descriptors' bounds handling needs no alignment of M or N, so an odd shape may gain most where the primary gains
nothing. A candidate that wins at some timed shapes and loses at a class of others (on the H200, gemm_tall_k's
descriptors: 2.56x at M = N = 1000, 0.976x at M = 16) comes back as a follow-up with its fast path off for that
class (:func:`xeforge.rewrite.blockio.off_where`: the class keeps the original loop), timed at every shape.
"""

from __future__ import annotations

from typing import Any

from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic, TrialOutcome, guarded
from stages.device_tuning_shapes import off_where_lost
from xeforge.rewrite import blockio
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import describe, kb_errors
from xeforge.rewrite.autotune import untuned_tile, with_configs
from xeforge.rewrite.tiling.grid import gemm_kernels
from xeforge.shape_classes import shape_class
from xeforge.rewrite.tiling.tactics import RewriteMemo

#: how many KB tile configurations to try the rewrite with on a GPU
RETILE_CONFIGS = 2


def _kb_patterns(ctx: StageContext) -> list[Any]:
    if ctx.kb is None or not ctx.device_id:
        return []
    try:
        return list(ctx.kb.select("block_io", ctx.device_id, ctx.triton).patterns)
    except Exception:  # an unknown device id or stage: no patterns to consult
        return []


def _has_descriptors() -> bool:
    try:
        import triton.language as tl  # lazy: triton imports torch (seconds); asked only when descriptors are planned
    except ImportError:  # pragma: no cover - triton is a dependency
        return False
    return hasattr(tl, "make_tensor_descriptor")


def preferred_modes(ctx: StageContext) -> tuple[list[str], str]:
    """The forms to try, in order, and why; [] when the KB says to keep plain pointers on this device."""
    pats = _kb_patterns(ctx)
    for p in pats:
        if p.spec.tactic == "keep-pointers" or p.id.startswith("bio-keep-pointers"):
            return [], f"KB {p.id}: {p.spec.effect}"
    if any(p.spec.tactic == "block-pointer" for p in pats):
        ids = [p.id for p in pats if p.spec.tactic == "block-pointer"]
        return [blockio.BLOCK_PTR, blockio.DESCRIPTOR], f"KB {', '.join(ids)} prefers block pointers"
    desc = [p.id for p in pats if p.spec.tactic == "tensor-descriptor"]
    if desc:
        return [blockio.DESCRIPTOR, blockio.BLOCK_PTR], f"KB {', '.join(desc)}"
    if ctx.kb is None and not _has_descriptors():
        return [blockio.BLOCK_PTR], "the installed Triton has no tl.make_tensor_descriptor"
    return [blockio.DESCRIPTOR, blockio.BLOCK_PTR], "tensor descriptors are Triton's structured-load API"


def _needs_allocator(ctx: StageContext) -> bool:
    """Device-side descriptors need ``triton.set_allocator`` in forward, except on Intel GPUs (KB
    ``bio-no-set-allocator-on-xpu``)."""
    return getattr(ctx.device, "kind", "cpu") != "xpu"


class TensorDescriptorTiles(Tactic):
    name = "tensor-descriptor"
    summary = ("load the K-loop tiles of a GEMM through tensor descriptors (or block pointers), keeping the "
               "pointer code for inputs that do not qualify; on a GPU also with the epilogue's tile loads")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[str, blockio.BlockIOPlan, str]:
        modes, why = preferred_modes(ctx)
        if not modes:
            raise NotApplicable(why)
        allocator = _needs_allocator(ctx)
        errors: list[str] = []
        for mode in modes:
            try:
                src, plan = blockio.rewrite(ctx.source, mode=mode, allocator=allocator)
            except NotApplicable as exc:
                errors.append(str(exc))
                break  # the shape is the problem, not the spelling
            bad = kb_errors(ctx, src)
            if bad:
                errors.append(f"{mode}: rejected by the KB for {ctx.device_id}: {'; '.join(bad)}")
                continue
            return src, plan, why
        raise NotApplicable("; ".join(errors) or "no form of structured loads is available")

    def rewritten(self, ctx: StageContext) -> tuple[str, blockio.BlockIOPlan]:
        """The incumbent with this tactic's rewrite (the form the KB picks), or NotApplicable: what a later stage
        composes with when this one did not adopt it."""
        src, plan, _ = self._rewrite(ctx)
        return src, plan

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan, why = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, f"{plan.describe()} ({why})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan, why = self._rewrite(ctx)
        except NotApplicable:
            return []
        params = {"mode": plan.mode, "kernel": plan.kernel}
        plain = Candidate(src, self.name, plan.describe(), params=params)
        retiled = with_configs(ctx, src, plan.kernel, RETILE_CONFIGS)
        out = [Candidate(tiled, self.name, f"{plan.describe()}; with {describe(cfg)}", params={**params, **cfg})
               for cfg, tiled in retiled]
        # an untuned small tile: the re-tiled rewrites first, since a time budget may judge only the first
        out = [*out, plain] if untuned_tile(ctx.source, plan.kernel, [c for c, _ in retiled]) else [plain, *out]
        if getattr(ctx.device, "can_time", False):
            # the epilogue's tile loads (a fused residual) through descriptors too: each needs a staging buffer in
            # shared memory, which may cost pipeline stages or not fit, so it is a candidate of its own, timed
            try:
                more, mplan = blockio.rewrite(ctx.source, mode=plan.mode, kernel=plan.kernel, epilogue_loads=True,
                                              allocator=_needs_allocator(ctx))
            except NotApplicable:
                more, mplan = None, plan
            if more is not None and len(mplan.accesses) > len(plan.accesses) and not kb_errors(ctx, more):
                out.append(Candidate(more, self.name, mplan.describe(), params={**params, "epilogue_loads": True}))
                for cfg, tiled in with_configs(ctx, more, plan.kernel, 1):  # and at the KB's top tile
                    out.append(Candidate(tiled, self.name, f"{mplan.describe()}; with {describe(cfg)}",
                                         params={**params, "epilogue_loads": True, **cfg}))
        if out and self._odd_shape(ctx):
            out[0].time_all_shapes = True
        return out

    @staticmethod
    def _odd_shape(ctx: StageContext) -> bool:
        timed = ctx.problem.timed_variants(ctx.device.kind) if ctx.problem is not None else []
        return len(timed) > 1 and any(shape_class(ctx.problem.spec, v.dims) == "odd" for v in timed)

    def follow_up(self, ctx: StageContext, outcomes: list[TrialOutcome]) -> list[Candidate]:
        """The candidate with the best objective among those gate 3 turned down for a loss at a class of shapes
        (:func:`stages.device_tuning_shapes.shape_classes`) while faster at others, with its fast path off for that
        class (an odd shape's too: ``M % 128 != 0 and M > 64``); none where a losing shape has no class of its own
        (the primary) or a class holds a shape it won at too."""
        return off_where_lost(ctx, outcomes, blockio.off_where, self.name, "the original loop kept where it lost")


@guarded("block_io")
def _detect_pointer_tiles(ctx: StageContext) -> list[Issue]:
    out = []
    try:
        model = ctx.model
    except Exception:  # an unparsable incumbent is reported by gate 1, not here
        return out
    for name in gemm_kernels(model):
        try:
            plan = blockio.plan_block_io(model, name)
        except NotApplicable:
            continue
        bases = ", ".join(sorted({p.desc.base for p in plan.accesses if p.access.kind == "load"}))
        out.append(Issue("block_io", "pointer-tiles",
                         f"{name} loads its K-loop tiles ({bases}) with pointer arithmetic and masks; 2D block "
                         "loads (Intel) and TMA (Hopper) need tensor descriptors", model.functions[name].line))
    return out


STAGE = Stage(
    name='block_io',
    order=5,
    goal=("structured memory access: tensor descriptors, or block pointers where the target's Triton still has "
          "them and they are faster"),
    kb_topics=('block_io', 'tensor_descriptor', 'block_pointer'),
    tactics=[TensorDescriptorTiles()],
    detectors=[_detect_pointer_tiles],
)
