"""Stage 7, device_tuning: the split-K tactic (more programs for a GEMM whose output tiles leave cores idle).

Owns: the ``split-k`` tactic and its sizing. A 2D- or 1D-grid GEMM whose output has fewer tiles than the device has
cores at the spec's bench variant is rewritten by :mod:`xeforge.rewrite.device_tuning.splitk`: SPLIT_K programs per
tile, each over one slice of the K loop, fp32 partial tiles summed in order by a second kernel (the kernel's own
epilogue, when it has one, runs there, once per tile). SPLIT_K is drawn
from :data:`SPLITS`, keeping at most :data:`PROGRAMS_PER_CORE` programs per core and at least
:data:`MIN_STEPS` K steps per slice; the default is the largest whose programs fill one wave of the cores
(:data:`ONE_WAVE_FILL` of it or more), else the smallest that gives every core a program (:func:`split_values`).
On a GPU each value is a candidate for the verifier to time; the interpreter gets one (correctness only), sized
from the KB device named with ``--target`` when there is one, else SPLIT_K=2.

On a GPU each candidate is sized per call where the host can count the launch's tiles (``splitk.apply`` with
``programs``: a tuple grid, or a META grid whose block sizes the launch passes; not an ``@triton.autotune``'d one):
SPLIT_K is computed in ``forward`` for about the programs the value gives at the bench variant, so a shape with
fewer rows (a decode step) splits further and one whose tiles fill the device runs the kernel as written.
Where the bench variant's tiles fill the device already but another timed shape's do not, one candidate sized at
that shape is proposed, timed at every shape (the bench variant runs the kernel as written).

Where a timed shape's tiles end in a last wave that leaves half the cores idle after at most a few whole ones
(gemm_square at 3000 x 4096 x 3000: 2.2 waves of 132 cores), the tail split
(:mod:`~xeforge.rewrite.device_tuning.splitk_tail`) is proposed after the first split-K candidate (alone where no
shape leaves half the cores idle), timed at every shape: sized per call, it splits that wave's tiles over K and a
decode step's tiles as the candidates above do. Behind a per-shape dispatch (per-shape-config's decode branch,
adopted earlier in the stage), where split-K refuses a kernel launched from two places, the tail split still
rewrites the ``else`` launch. A C tile the shared-memory refit stored in two halves is stored whole again for the
plan (:func:`stored_whole`); the engine halves the candidates' stores again where they need it. Listed first in
``stages/device_tuning.py``: the swizzle would turn the 2D grid into a 1D one, and the launch-parameter
search should tune the split kernel (smaller tiles that fill the device are its alternative, timed there).
"""

from __future__ import annotations

from typing import Any

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.rewrite import NotApplicable
from xeforge.kernel_model import parse_kernel
from xeforge.rewrite.device_tuning import splitk, splitk_tail
from xeforge.rewrite.tiling.configs import kb_errors
from xeforge.rewrite.tiling.subtile import whole_stores
from xeforge.rewrite.tiling.tactics import RewriteMemo

SPLITS = (2, 4, 8)
#: programs per core the split may reach (tiles * SPLIT_K)
PROGRAMS_PER_CORE = 4
#: K steps (of BLOCK_K) each slice keeps at the bench variant
MIN_STEPS = 4
#: the share of one wave of the cores a split's programs must fill to be the default without a second wave
ONE_WAVE_FILL = 0.75
#: SPLIT_K on the interpreter when no core count is known
INTERPRETER_SPLIT = 2


def core_count(ctx: StageContext) -> tuple[int | None, str]:
    """The cores to fill and where the count came from: the device, else its knowledge-base entry."""
    device = ctx.device
    if not getattr(device, "interpreter", False) and getattr(device, "cores", None):
        return int(device.cores), device.name
    entry = None
    if ctx.kb is not None and ctx.device_id:
        entry = getattr(ctx.kb, "devices", {}).get(ctx.device_id)
    cores = entry.value("cores") if entry is not None else None
    return (int(cores), f"KB {ctx.device_id}") if cores else (None, "")


def bench_variant(ctx: StageContext) -> Any:
    """The variant the split is sized for: the GPU timing variant (bench-gpu), also on the interpreter."""
    kind = ctx.device.kind if ctx.device.kind != "cpu" else "cuda"
    return ctx.problem.timing_variant(kind)


def split_values(tiles: int, steps: int, cores: int) -> list[int]:
    """SPLIT_K candidates, the default first: the largest whose programs fit one wave of the cores and fill
    :data:`ONE_WAVE_FILL` of it; else the smallest that gives every core a program. On an H100 (2026-12-07),
    gemm_tall_k's 32 tiles of 128 x 256: SPLIT_K 4 (128 programs, one wave) ran 3.06x over the unsplit kernel, 8 (256
    programs, two waves) 2.78x and 2 (64 programs) 1.89x; under a time budget the first candidate may be the only
    one judged."""
    ok = [s for s in SPLITS if tiles * s <= PROGRAMS_PER_CORE * cores and steps // s >= MIN_STEPS]
    if not ok:
        return []
    one_wave = [s for s in ok if ONE_WAVE_FILL * cores <= tiles * s <= cores]
    default = one_wave[-1] if one_wave else next((s for s in ok if tiles * s >= cores), ok[-1])
    return [default] + [s for s in ok if s != default]


def stored_whole(source: str) -> tuple[str, list[str]] | None:
    """``source`` with every kernel's C tile stored whole where the shared-memory refit halved it
    (:func:`~xeforge.rewrite.tiling.subtile.whole_stores`), and what changed; None where no store is halved. On an
    H100 (2026-12-07) gemm_tall_k's block_io stage adopted its descriptors with the store halved, and split-K, which
    its 32 tiles on 132 cores need, then refused the kernel."""
    changed: list[str] = []
    for name in parse_kernel(source).functions:
        got = whole_stores(source, name)
        if got is not None:
            source, more = got
            changed += more
    return (source, changed) if changed else None


class SplitK(Tactic):
    name = "split-k"
    summary = ("SPLIT_K programs per output tile over slices of K, fp32 partials summed in order by a second "
               "kernel that runs the epilogue, when a GEMM's tiles leave cores idle")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[splitk.SplitPlan, list[tuple[int, str, str, bool]]]:
        try:
            plan = splitk.find(ctx.source, ctx.problem)
        except NotApplicable:
            whole = stored_whole(ctx.source)
            if whole is not None:  # the split's plan reads the store of acc, which the halves hide
                plan, out = self._build(ctx.with_source(whole[0]))
                note = (f"; C stored whole again for the split ({'; '.join(whole[1])}: halved again where shared "
                        "memory needs it)")
                return plan, [(s, src, why + note, every) for s, src, why, every in out]
            behind = self._behind_dispatch(ctx)
            if behind is None:
                raise
            return behind
        variant = bench_variant(ctx)
        tiles, steps = splitk.sizes(ctx.source, plan, ctx.problem, variant)
        at = f"at {variant.name}"
        if steps < MIN_STEPS * min(SPLITS):
            raise NotApplicable(f"{plan.kernel}: the K loop has {steps} step(s) {at}, too few to split (each slice "
                                f"needs at least {MIN_STEPS})")
        cores, source = core_count(ctx)
        interpreter = not getattr(ctx.device, "can_time", False)
        if cores is None and not interpreter:
            raise NotApplicable(f"{plan.kernel}: {tiles} output tile(s) {at}, but the device's core count is "
                                "unknown (name a knowledge-base device with --target)")
        all_shapes = False
        # the tail split goes second, after the first split-K candidate: sized per call, it also splits a decode
        # step's tiles, and a part-filled last wave as they do not; in an H100 probe (2026-12-07) it ran gemm_square's
        # port 1.08x faster at 3072 x 4096 x 3072 and 0.93x at 3000 x 4096 x 3000, where the operands' row pitch of
        # 6000 bytes slows its slices (docs/measurements/ports-h100-2026-12-07c)
        tail = [] if interpreter or cores is None else self._tail(ctx, plan, cores)
        if cores is not None and tiles >= cores:
            idle = self._idle_shape(ctx, plan, cores)
            if idle is None and tail:
                return plan, tail
            if idle is None:
                raise NotApplicable(f"{plan.kernel}: {tiles} output tiles {at} already fill the {cores} cores "
                                    f"({source}), and so do those of every other timed shape")
            if interpreter:
                raise NotApplicable(f"{plan.kernel}: {tiles} output tiles {at} fill the {cores} cores; the split "
                                    f"sized per call for {idle[0].name} needs a GPU (on the interpreter's ci shapes "
                                    "it does not split)")
            variant, tiles, steps = idle
            at, all_shapes = f"at {variant.name}", True
        values = split_values(tiles, steps, cores) if cores else [INTERPRETER_SPLIT]
        if not values:
            raise NotApplicable(f"{plan.kernel}: no SPLIT_K in {SPLITS} keeps {MIN_STEPS}+ K steps per slice "
                                f"({steps} steps {at})")
        if interpreter:
            values = values[:1]
        else:
            values = values[:max(1, ctx.settings.tuning_budget if ctx.settings else len(values))]
        out, bad, unsized = [], [], ""
        for s in values:
            src = None
            if not interpreter:  # the interpreter checks the split itself: its ci shapes are too small to split
                try:
                    src = splitk.apply(ctx.source, plan, s, programs=tiles * s)
                except NotApplicable as exc:
                    unsized = str(exc)
            sized = src is not None
            if not sized:
                if all_shapes:  # a constant split would run at the bench variant too, where the tiles fill the cores
                    continue
                src = splitk.apply(ctx.source, plan, s)
            errors = kb_errors(ctx, src)
            if errors:
                bad.append(f"SPLIT_K={s}: {'; '.join(errors)}")
                continue
            per = -(-steps // s)
            if cores:
                why = (f"{tiles} output tiles {at} for {cores} cores ({source}) -> {tiles * s} programs, "
                       f"{per} of {steps} K steps each")
            else:
                why = (f"{tiles} output tiles, {steps} K steps {at}; no core count on the interpreter, so this "
                       "only checks the rewrite")
            if sized:
                why += (f"; sized per call for about {tiles * s} programs at every shape"
                        + (f" (the tiles at {bench_variant(ctx).name} fill the cores: the kernel as written runs "
                           "there)" if all_shapes else ""))
            out.append((s, src, why, all_shapes))
        out[1:1] = tail
        if not out and not bad:  # every value needed the split sized per call (all_shapes), and it cannot be
            raise NotApplicable(f"{plan.kernel}: the tiles at {bench_variant(ctx).name} fill the cores, so a split "
                                f"{at} must be sized per call, and {unsized}")
        if not out:
            raise NotApplicable(f"the split kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return plan, out

    def _behind_dispatch(self, ctx: StageContext) -> tuple[splitk.SplitPlan, list[tuple[int, str, str, bool]]] | None:
        """The tail split of a GEMM launched from a per-shape dispatch, at its ``else`` launch (the one a part-filled
        wave's shape runs: gemm_square's 3000 x 4096 x 3000 behind the decode branch per-shape-config adds first);
        None where there is no such dispatch, it does not fit, or no timed shape asks for it. Split-K itself stays
        refused there: the dispatch's decode branch already has that class."""
        cores, _ = core_count(ctx)
        if cores is None or not getattr(ctx.device, "can_time", False):
            return None
        found = splitk_tail.behind_dispatch(ctx.source)
        if found is None:
            return None
        base, kernel, line = found
        try:
            plan = splitk.find(base, ctx.problem)
        except NotApplicable:
            return None
        if plan.kernel != kernel:
            return None
        out = self._tail(ctx, plan, cores, base=base, line=line)
        return (plan, out) if out else None

    @staticmethod
    def _tail(ctx: StageContext, plan: splitk.SplitPlan, cores: int, base: str | None = None,
              line: int | None = None) -> list[tuple[int, str, str, bool]]:
        """The tail split (:mod:`~xeforge.rewrite.device_tuning.splitk_tail`) as one candidate, where a timed shape
        ends in a last wave that leaves half the cores idle or more after at most ``MAX_WAVES`` whole ones
        (gemm_square at 3000 x 4096 x 3000: 288 tiles, 2.2 waves of 132 cores); none elsewhere, or where the
        rewrite does not fit (its reason is then the candidate's absence: the split-K candidates still run)."""
        kind = ctx.device.kind if ctx.device.kind != "cpu" else "cuda"
        for variant in ctx.problem.timed_variants(kind):
            try:
                tiles, steps = splitk.sizes(base or ctx.source, plan, ctx.problem, variant)
            except NotApplicable:
                continue
            start, split = splitk_tail.size((tiles,), steps, cores)
            if start == 0 or split < 2:
                continue
            try:
                src = splitk_tail.apply(ctx.source, plan, cores, line=line)
            except NotApplicable:
                return []
            if kb_errors(ctx, src):
                return []
            tail = tiles - start
            why = (f"{tiles} output tiles at {variant.name} are {start // cores} whole wave(s) of {cores} cores and "
                   f"{tail} more; those {tail} run in {split} slices of K ({tail * split} programs, "
                   f"{-(-steps // split)} of {steps} K steps each), added in slice order by the slice that ends last; "
                   "sized per call at every shape (whole waves, or none, run as written)"
                   + (f"; at the launch of line {line}, the per-shape dispatch's else branch" if line else ""))
            return [(split, src, why, True)]
        return []

    @staticmethod
    def _idle_shape(ctx: StageContext, plan: splitk.SplitPlan, cores: int) -> tuple[Any, int, int] | None:
        """The first timed shape other than the bench variant whose output tiles leave half the cores idle or more,
        with its tiles and K steps (a decode step's M = 16 under a bench variant of M = 1024); None where there is
        none."""
        kind = ctx.device.kind if ctx.device.kind != "cpu" else "cuda"
        for variant in ctx.problem.timed_variants(kind)[1:]:
            try:
                tiles, steps = splitk.sizes(ctx.source, plan, ctx.problem, variant)
            except NotApplicable:
                continue
            if tiles * 2 <= cores and steps >= MIN_STEPS * min(SPLITS):
                return variant, tiles, steps
        return None

    def check(self, ctx: StageContext) -> Applicability:
        try:
            plan, out = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        values = ", ".join(str(s) for s, *_ in out)
        kinds = "; ".join(dict.fromkeys(self._describe(plan, None, src) for _, src, *_ in out))
        return Applicability(True, f"{kinds}; SPLIT_K {values} ({out[0][2]})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            plan, out = self._rewrite(ctx)
        except NotApplicable:
            return []
        return [Candidate(src, self.name, f"{self._describe(plan, s, src)}: {why}",
                          kind="rewrite" if i == 0 else "search",
                          params={"kernel": plan.kernel, splitk.PARAM: s}, time_all_shapes=all_shapes)
                for i, (s, src, why, all_shapes) in enumerate(out)]

    @staticmethod
    def _describe(plan: splitk.SplitPlan, split: int | None, src: str) -> str:
        """What a candidate is: the tail split (its copy is in ``src``) or split-K (:meth:`SplitPlan.describe`)."""
        if f"def {splitk_tail.kernel_name(plan.kernel)}(" in src:
            what = f"{splitk.PARAM}={split}" if split else splitk.PARAM
            return (f"{plan.kernel}: tail split, whole waves of tiles as written and the last wave's tiles in "
                    f"{what} slices of K ({splitk_tail.kernel_name(plan.kernel)})")
        return plan.describe(split)
