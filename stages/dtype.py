"""Stage 2, dtype: honour the precision contract: fp32 accumulation, no needless up-casts before tl.dot, no fp64 on parts without native fp64.

Owns: this stage's goal, its issue detectors and five deterministic tactics, each a codemod from
:mod:`xeforge.rewrite.dtype`:

- ``drop-upcast-before-dot``: fp16/bf16 tiles loaded and cast to fp32 before ``tl.dot`` feed the dot
  directly (matrix units at 16-bit rate; the dot still accumulates and returns fp32); on a GPU also with the top
  KB tiles, since at small tiles the 16-bit dot is not faster and the rewrite alone would be refused.
- ``dot-accumulate-in-place``: ``acc += tl.dot(a, b)`` -> ``acc = tl.dot(a, b, acc)`` for an fp32 ``acc``.
- ``fp32-accumulator``: a dot accumulating in fp16/bf16 accumulates in fp32.
- ``fp64-to-fp32``: fp64 arithmetic becomes fp32 when no input of any variant is fp64.
- ``narrow-intermediate``: an fp32 buffer one Triton kernel writes and only other Triton kernels read is stored
  in the writer's 16-bit input dtype, the readers' loads up-cast to fp32 (:mod:`xeforge.rewrite.dtype_narrow`).

Which operands are 16-bit comes from the spec's variant dtypes (the verifier casts floating inputs and the
Model to the variant's dtype), as each variant's trace shows them at the kernel's launch: a variant whose trace
fails or does not launch the kernel leaves them unknown, and the tactic says so. No tactic lowers precision
below the inputs': a GEMM on fp32 inputs is never moved to tf32/bf16 here, whatever the spec's ``precision``
says — that is a numerics trade the verifier's fp32 tolerances would not accept, and it is left to the llm
engine and a spec that asks for it.
"""

from __future__ import annotations

from typing import Any, Callable

from stages.base import Applicability, Candidate, Issue, Stage, StageContext, Tactic
from xeforge.kernel_model import parse_kernel
from xeforge.rewrite import NotApplicable
from xeforge.rewrite import dtype as dr
from xeforge.rewrite.dtype_narrow import narrow_intermediates
from xeforge.rewrite.context import Ctx, guarded, memo_key
from xeforge.rewrite.tiling.configs import describe
from xeforge.rewrite.autotune import with_configs
from xeforge.rewrite.tiling.grid import gemm_kernels

#: KB tile configurations a rewrite that pays off only with larger tiles is also proposed with (on a GPU)
RETILE_CONFIGS = 2


class RewriteTactic(Tactic):
    """A tactic that is one source rewrite: applies when the rewrite does, proposes its result."""

    rewrite: Callable[[str, Any], tuple[str, str]]
    not_applicable_prefix = ""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str], tuple[str, str] | str] = {}

    def result(self, ctx: StageContext) -> tuple[str, str] | str:
        """(new source, description), or the reason it does not apply (memoised per source and spec)."""
        key = memo_key(ctx)
        if key not in self._memo:
            self._memo[key] = guarded(lambda: type(self).rewrite(ctx.source, ctx.problem))
            if len(self._memo) > 32:
                self._memo.pop(next(iter(self._memo)))
        return self._memo[key]

    def check(self, ctx: StageContext) -> Applicability:
        r = self.result(ctx)
        if isinstance(r, str):
            return Applicability(False, self.not_applicable_prefix + r)
        return Applicability(True, r[1])

    def propose(self, ctx: StageContext) -> list[Candidate]:
        r = self.result(ctx)
        if isinstance(r, str):
            return []
        return [Candidate(r[0], self.name, r[1], kind="rewrite")]


class DropUpcastBeforeDot(RewriteTactic):
    name = "drop-upcast-before-dot"
    summary = "feed fp16/bf16 tiles to tl.dot without casting them to fp32 (accumulation stays fp32)"
    rewrite = staticmethod(dr.drop_dot_upcasts)

    def propose(self, ctx: StageContext) -> list[Candidate]:
        """The rewrite as is and, on a GPU, also with the top KB tiles: at small tiles (16 x 16) a GEMM is bound by
        its loads and a 16-bit dot is not faster than the fp32 one, so the rewrite alone may be refused and the
        kernel stays on fp32 matrix units for the rest of the port (measured on the H200: 220 TFLOP/s instead of
        520 for the same tiles later on)."""
        out = super().propose(ctx)
        if not out:
            return out
        src = out[0].source
        # the re-tiled kernel is one forward launches: read from the incumbent, whose trace says which kernels ran
        # (the rewritten text was never traced, so its own model counts a backward kernel's launch as live)
        rewritten = parse_kernel(src).functions
        for kernel in [k for k in gemm_kernels(ctx.model) if k in rewritten][:1]:
            for cfg, tiled in with_configs(ctx, src, kernel, RETILE_CONFIGS):
                out.append(Candidate(tiled, self.name, f"{out[0].description}; with {describe(cfg)}",
                                     kind="rewrite", params=cfg))
        return out


class DotAccumulateInPlace(RewriteTactic):
    name = "dot-accumulate-in-place"
    summary = "acc += tl.dot(a, b) -> acc = tl.dot(a, b, acc) with an fp32 accumulator"
    rewrite = staticmethod(dr.dot_accumulate_in_place)


class Fp32Accumulator(RewriteTactic):
    name = "fp32-accumulator"
    summary = "accumulate tl.dot in fp32 where it accumulates in fp16/bf16"
    rewrite = staticmethod(dr.fp32_accumulator)


class Fp64ToFp32(RewriteTactic):
    name = "fp64-to-fp32"
    summary = "replace fp64 arithmetic by fp32 when no input is fp64"
    rewrite = staticmethod(dr.fp64_to_fp32)


class NarrowIntermediate(RewriteTactic):
    name = "narrow-intermediate"
    summary = ("store an fp32 buffer passed from one Triton kernel to others in the inputs' 16-bit dtype "
               "(the readers still compute in fp32)")
    rewrite = staticmethod(narrow_intermediates)


# ------------------------------------------------------------------------------------------------ detectors
def _ctx(ctx: StageContext) -> Ctx | None:
    try:
        return Ctx(ctx.source, ctx.problem)
    except NotApplicable:
        return None


def _detect_upcasts(ctx: StageContext) -> list[Issue]:
    c = _ctx(ctx)
    if c is None:
        return []
    out = []
    dots, _ = dr.find_dot_upcasts(c)
    for _, ups in dots:
        for u in ups:
            dts = {v: d for v, d in dr.param_dtypes(c, u.fn, u.param).items() if d in dr.SIXTEEN}
            if dts:
                shown = ", ".join(f"{d} in {v}" for v, d in dts.items())
                out.append(Issue("dtype", "upcast-before-dot", f"{u.fn}: {u.operand} ({u.param}: {shown}) is cast to "
                                 "fp32 before tl.dot, forfeiting the 16-bit matrix units", u.line))
    return out


def _detect_accumulators(ctx: StageContext) -> list[Issue]:
    out = []
    for key, code, what in (("acc", "dot-acc-augassign",
                             "accumulates with `acc += tl.dot(a, b)` instead of passing acc to tl.dot"),
                            ("fp32acc", "dot-16bit-accumulator", "accumulates tl.dot in 16 bits")):
        r = _TACTICS[key].result(ctx)
        if not isinstance(r, str):
            out.append(Issue("dtype", code, f"a kernel {what}"))
    return out


def _detect_fp64(ctx: StageContext) -> list[Issue]:
    r = _TACTICS["fp64"].result(ctx)
    if isinstance(r, str):
        return []
    native = None
    if ctx.kb is not None and ctx.device_id:
        try:
            native = ctx.kb.devices[ctx.device_id].value("has_fp64")
        except (AttributeError, KeyError):
            native = None
    where = "" if native is None else (" (the target has native fp64, at a fraction of the fp32 rate)" if native
                                       else " (the target has no native fp64: it is emulated or rejected)")
    return [Issue("dtype", "fp64", f"fp64 arithmetic where the inputs are at most fp32{where}")]


_TACTICS = {"upcast": DropUpcastBeforeDot(), "acc": DotAccumulateInPlace(), "fp32acc": Fp32Accumulator(),
            "fp64": Fp64ToFp32(), "narrow": NarrowIntermediate()}

STAGE = Stage(
    name='dtype',
    order=2,
    goal='honour the precision contract: fp32 accumulation, no needless up-casts before tl.dot, no fp64 on parts without native fp64',
    kb_topics=('dtype', 'precision'),
    tactics=list(_TACTICS.values()),
    detectors=[_detect_upcasts, _detect_accumulators, _detect_fp64],
)
