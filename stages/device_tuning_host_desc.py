"""Stage 7, device_tuning: the host-descriptors tactic (tensor descriptors built on the host, passed to the kernel).

Owns: the ``host-descriptors`` tactic. A kernel that makes its tensor descriptors with ``tl.make_tensor_descriptor``
(the block_io stage's rewrite, or the user's own code) gets them as arguments the host builds
(:mod:`xeforge.rewrite.device_tuning.host_desc`), at every launch and, for an ``@triton.autotune``'d kernel, with
the block shape set per configuration by a pre_hook. Which devices get it is the knowledge base's choice: a block_io
pattern for the device whose tactic is ``host-descriptors`` (``bio-host-descriptors-on-hopper``: measured on the
H200); elsewhere (Intel GPUs, whose 2D block path needs the descriptor made in the kernel, and the interpreter) it
does not apply, and says which pattern would make it. Listed last in the stage, so it turns the descriptors of the
tuned kernel (its tile, halves and tile loop) into host ones; the verifier times it against that kernel.
"""

from __future__ import annotations

from stages.base import Applicability, Candidate, StageContext, Tactic
from xeforge.rewrite import NotApplicable
from xeforge.rewrite.device_tuning import host_desc
from xeforge.rewrite.tiling.configs import kb_errors
from xeforge.rewrite.tiling.tactics import RewriteMemo

TACTIC = "host-descriptors"


def kb_reason(ctx: StageContext) -> str | None:
    """The KB pattern that asks for host-side descriptors on this device (its id and effect), or None."""
    if ctx.kb is None or not ctx.device_id:
        return None
    try:
        patterns = ctx.kb.select("block_io", ctx.device_id, ctx.triton).patterns
    except Exception:  # an unknown device id: no pattern applies
        return None
    ids = [p.id for p in patterns if p.spec.tactic == TACTIC]
    return f"KB {', '.join(ids)}" if ids else None


class HostDescriptors(Tactic):
    name = TACTIC
    summary = ("build the kernel's tensor descriptors on the host (TensorDescriptor) and pass them in, instead of "
               "tl.make_tensor_descriptor in the kernel (where the KB says the device gains)")

    def __init__(self) -> None:
        self._memo = RewriteMemo()

    def _build(self, ctx: StageContext) -> tuple[str, host_desc.HostDescPlan, str]:
        why = kb_reason(ctx)
        if why is None:
            raise NotApplicable(f"no KB pattern asks for host-side descriptors on {ctx.device_id or ctx.device.kind} "
                                f"(a block_io pattern with tactic: {TACTIC} for the device would)")
        src, plan = host_desc.rewrite(ctx.source)
        bad = kb_errors(ctx, src)
        if bad:
            raise NotApplicable(f"host-side descriptors break KB constraints for {ctx.device_id}: {'; '.join(bad)}")
        return src, plan, why

    def check(self, ctx: StageContext) -> Applicability:
        try:
            _, plan, why = self._memo.get(ctx, self._build)
        except NotApplicable as exc:
            return Applicability(False, str(exc))
        return Applicability(True, f"{plan.describe()} ({why})")

    def propose(self, ctx: StageContext) -> list[Candidate]:
        try:
            src, plan, _ = self._memo.get(ctx, self._build)
        except NotApplicable:
            return []
        return [Candidate(src, self.name, plan.describe(), params={"kernel": plan.kernel, "host_descriptors": True})]
