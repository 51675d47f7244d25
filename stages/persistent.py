"""Stage 6, persistent: a persistent kernel over tiles, sized from the device's core count.

Owns: this stage's goal, its detector (a launch that starts many more programs than the device has cores) and its
tactic ``persistent-loop`` (KB ``persistent-grid-from-cores``), which rewrites a tiled 1D or 2D grid into a loop
over tiles with :mod:`xeforge.rewrite.persistent`: ``min(#tiles, cores)`` programs, the core count read from the
device at run time (SMs on NVIDIA, Xe-cores on Intel). Where the launch already starts no more programs than the
device has cores (each would walk one tile) it is proposed unless half the cores or more would idle and split-K
applies (split-K fills idle cores and needs the one-tile grid): the tile-loop form alone compiled 1.27x faster than
the one-tile-per-program kernel on the H200 (Triton 3.6, 1024 x 4096 x 4096 bf16, 128 tiles;
docs/measurements/HISTORY.md), so it is timed, not ruled out. On a GPU the rewrite is also proposed with the top
KB tile configurations (and, on NVIDIA, with the tile loop flattened into the K loop as upstream's persistent matmul
does), and over the block_io stage's rewrite where that stage did not adopt it (descriptors that lost alone; the two
compose); where the KB offers it (Hopper, Triton 3.5 or later), a loop over tensor descriptors is also proposed
warp-specialized; where the incumbent's compile spilled registers, the loops with the epilogue on two column halves
of the accumulator come first; the verifier times each one. A loop turned down for a loss at a class of shapes only
(an odd one, a decode step's) comes back starting one program a tile there. The tiles of a row waiting for each
other inside the loop, to finish a split row reduction there, is no tactic: it lost to the two passes (KB
``persistent-row-sync``).
"""

from __future__ import annotations

from stages.base import (Applicability, Candidate, Issue, Stage, StageContext, Tactic, TrialOutcome, guarded,
                         incumbent_spills)
from stages.block_io import TensorDescriptorTiles
from stages.device_tuning_shapes import off_where_lost
from stages.device_tuning_splitk import SplitK
from xeforge.analysis.launches import live_launches
from xeforge.rewrite import persistent
from xeforge.rewrite.tiling import NotApplicable
from xeforge.rewrite.tiling.configs import describe, kb_errors
from xeforge.rewrite.autotune import untuned_tile, with_configs
from xeforge.rewrite.device_tuning.epilogue import split_epilogue
from xeforge.rewrite.tiling.tactics import RewriteMemo

#: how many KB tile configurations to try the rewrite with on a GPU
RETILE_CONFIGS = 2
#: a launch with more programs than this many per core is reported
PROGRAMS_PER_CORE_REPORTED = 4


class PersistentTileLoop(Tactic):
    name = "persistent-loop"
    summary = "one program per core walks the tiles (grid = min(#tiles, cores), cores read at run time)"

    def __init__(self) -> None:
        self._memo = RewriteMemo()
        self._split_k = SplitK()
        self._block_io = TensorDescriptorTiles()

    def _rewrite(self, ctx: StageContext):
        return self._memo.get(ctx, self._build)

    def _build(self, ctx: StageContext) -> tuple[str, persistent.PersistentPlan]:
        src, plan = persistent.rewrite(ctx.source)
        few = _no_more_programs_than_cores(ctx, plan.kernel, self._split_k)
        if few:
            raise NotApplicable(few)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"the persistent kernel breaks KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return src, plan

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan = self._rewrite(ctx)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, plan.describe())

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan = self._rewrite(ctx)
        except NotApplicable:
            return []
        out = [Candidate(src, self.name, plan.describe(), params={"kernel": plan.kernel})]
        if getattr(ctx.device, "can_time", False) and getattr(ctx.device, "kind", "") == "cuda":
            # upstream's persistent Hopper matmul flattens the tile loop with its K loop; timed, not assumed
            try:
                flat, _ = persistent.rewrite(ctx.source, kernel=plan.kernel, flatten=True)
                out.append(Candidate(flat, self.name, f"{plan.describe()}; flattened tile loop",
                                     params={"kernel": plan.kernel, "flatten": True}))
            except NotApplicable:
                pass
        out = [*self._halved(ctx, plan.kernel, out), *out]
        retiled = with_configs(ctx, src, plan.kernel, RETILE_CONFIGS)
        tiled = [Candidate(t, self.name, f"{plan.describe()}; with {describe(cfg)}",
                           params={"kernel": plan.kernel, **cfg}) for cfg, t in retiled]
        both = self._with_descriptors(ctx, plan)  # the loop over descriptors, then re-tiled
        if untuned_tile(ctx.source, plan.kernel, [c for c, _ in retiled]):
            # an untuned small tile: the re-tiled loops first (over descriptors first), since a time budget may
            # judge only the first candidates
            return self._specialized(ctx, [*both[1:], *tiled, *out, *both[:1]])
        return self._specialized(ctx, [*out, *tiled, *both])

    def follow_up(self, ctx: StageContext, outcomes: list[TrialOutcome]) -> list[Candidate]:
        """The loop with the best objective among those gate 3 turned down for a loss at a class of shapes while
        faster at others (:func:`stages.device_tuning_shapes.off_where_lost`), starting one program a tile in that
        class (:func:`persistent.off_where`); none where a shape it lost at has no class of its own. On an H100
        (2026-12-07) gemm_square's loop ran 1.05-1.06x at 4096^3 and 0.93-0.95x at 3000 x 4096 x 3000, an odd shape,
        and was not adopted for either."""
        return off_where_lost(ctx, outcomes, persistent.off_where, self.name, "one program a tile where it lost")

    def _halved(self, ctx: StageContext, kernel: str, loops: list[Candidate]) -> list[Candidate]:
        """Where the incumbent's kernel spilled registers (its compile at the primary shape), each of ``loops`` with
        its epilogue run on two column halves of the accumulator (:func:`split_epilogue`), to be judged first: a
        time budget may judge only the first candidates, and the plain loop keeps every temporary of the whole
        tile live. On an H100 (2026-12-07, call U of docs/measurements/ports-h100-2026-12-07e) several-outputs'
        port spilled 46 registers and judged only the plain loop (0.984x) in its share of a 5-minute budget; the
        halved epilogue inside a tile loop ran 1.4-2.8% faster on the H200
        (:mod:`xeforge.rewrite.device_tuning.epilogue`)."""
        spills = incumbent_spills(ctx.diagnosis, kernel)
        if not spills:
            return []
        out = []
        for c in loops:
            try:
                halved, _ = split_epilogue(c.source, kernel)
            except NotApplicable:
                continue
            if kb_errors(ctx, halved):
                continue
            out.append(Candidate(halved, self.name, f"{c.description}; the epilogue on two column halves of the "
                                 f"accumulator (the incumbent spills {spills} registers)",
                                 params={**c.params, "epilogue_halves": True}))
        return out

    def _specialized(self, ctx: StageContext, cands: list[Candidate]) -> list[Candidate]:
        """``cands`` with, right after the first of them whose tiles go through tensor descriptors, its tile loop
        warp-specialized, where the KB offers that (``persistent-warp-specialize-hopper``: Hopper, Triton 3.5 or
        later; 1.03x at 4096^3 in an H100 probe). Its tile and form are the ones this stage tries first."""
        if not _warp_specialized(ctx):
            return cands
        at = next((i for i, c in enumerate(cands) if c.params.get("block_io") or _descriptors(c.source)), None)
        if at is None:
            return cands
        first = cands[at]
        try:
            ws = persistent.specialize(first.source, first.params["kernel"])
        except (NotApplicable, KeyError):
            return cands
        if kb_errors(ctx, ws):
            return cands
        cand = Candidate(ws, self.name, f"{first.description}; warp-specialized tile loop",
                         params={**first.params, "warp_specialize": True})
        return [*cands[:at + 1], cand, *cands[at + 1:]]

    def _with_descriptors(self, ctx: StageContext, plan: persistent.PersistentPlan) -> list[Candidate]:
        """On a GPU, where the block_io stage's descriptors were not adopted (they lost alone), the tile loop over
        descriptor loads as well: the two compose. On the H200 (Triton 3.6, linear_relu, 1024 x 4096 x 4096 bf16)
        the descriptor GEMM was 0.92x of the pointer GEMM with one tile per program, and 1.14x of it inside a tile
        loop (docs/measurements/HISTORY.md); each such candidate is timed."""
        if not getattr(ctx.device, "can_time", False):
            return []
        try:
            bio_src, bio = self._block_io.rewritten(ctx)  # the form the KB picks for the device (descriptors or not)
            if bio.kernel != plan.kernel:
                return []
            both, _ = persistent.rewrite(bio_src, kernel=plan.kernel)
        except NotApplicable:
            return []
        if kb_errors(ctx, both):
            return []
        what = f"{plan.describe()}; over {bio.describe()}"
        out = [Candidate(both, self.name, what, params={"kernel": plan.kernel, "block_io": True})]
        for cfg, tiled in with_configs(ctx, both, plan.kernel, 1):
            out.append(Candidate(tiled, self.name, f"{what}; with {describe(cfg)}",
                                 params={"kernel": plan.kernel, "block_io": True, **cfg}))
        return out


def _warp_specialized(ctx: StageContext) -> bool:
    """Whether the knowledge base offers the warp-specialized tile loop for this device and Triton (a GPU that times
    it: on the interpreter there is nothing to rank)."""
    if not getattr(ctx.device, "can_time", False) or ctx.kb is None or not ctx.device_id:
        return False
    try:
        pats = ctx.kb.select("persistent", ctx.device_id, ctx.triton).patterns
    except Exception:  # an unknown device id: no pattern to consult
        return False
    return any(p.id == "persistent-warp-specialize-hopper" for p in pats)


def _descriptors(source: str) -> bool:
    """Whether the kernel file loads through tensor descriptors (made in a kernel or on the host)."""
    return "make_tensor_descriptor" in source or "TensorDescriptor" in source


#: the persistent loop is held back for split-K where the launch leaves at least this share of the cores idle (one
#: wave that nearly fills the device, 128 tiles for 132 SMs, gains nothing from the split's partial tiles' traffic)
IDLE_SHARE = 0.5


def _no_more_programs_than_cores(ctx: StageContext, kernel: str, split_k: SplitK) -> str | None:
    """Why the persistent loop is held back here: at the timing variant the launch starts no more than half as many
    programs as the device has cores, so each would walk one tile and half the cores idle, and split-K applies (the
    device_tuning stage's split-K fills them, and it needs the one-tile-per-program grid). None when the loop may
    gain — more programs, or split-K cannot apply (the tile-loop form is then timed against the one-tile kernel) —
    or when nothing is known."""
    cores = getattr(ctx.device, "cores", None)
    if not cores or not getattr(ctx.device, "can_time", False):
        return None
    try:
        variant = ctx.problem.timing_variant(ctx.device.kind)
        n = persistent.launched_programs(ctx.model, kernel, ctx.problem, variant)
    except Exception:  # a forward the static evaluation cannot follow: no reason to hold the rewrite back
        return None
    if n and n <= cores * IDLE_SHARE and split_k.check(ctx).applies:
        return (f"{kernel} starts {n} program(s) at {variant.name} for {cores} cores: each would walk one tile, and "
                "split-K applies (device_tuning's split-K fills the idle cores; it needs the one-tile grid)")
    return None


@guarded("persistent")
def _detect_many_programs(ctx: StageContext) -> list[Issue]:
    cores = getattr(ctx.device, "cores", None)
    if not cores or getattr(ctx.device, "interpreter", False):
        return []
    try:
        model = ctx.model
        variant = ctx.problem.timing_variant(ctx.device.kind)
    except Exception:  # an unparsable incumbent or a spec without variants: nothing to size
        return []
    out = []
    for kernel in dict.fromkeys(s.kernel for s in live_launches(model)):  # the kernels the trace saw run
        fn = model.functions[kernel]
        if persistent.is_persistent(fn.node):
            continue
        n = persistent.launched_programs(model, kernel, ctx.problem, variant)
        if n and n > PROGRAMS_PER_CORE_REPORTED * cores:
            out.append(Issue("persistent", "one-program-per-tile",
                             f"{kernel} launches {n:,} programs at {variant.name} for {cores} cores", fn.line))
    return out


STAGE = Stage(
    name='persistent',
    order=6,
    goal="a persistent kernel over tiles, sized from the device's core count",
    kb_topics=('persistent',),
    tactics=[PersistentTileLoop()],
    detectors=[_detect_many_programs],
)
