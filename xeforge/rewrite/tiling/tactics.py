"""Plumbing shared by the stage modules of the tiling tactics (memory_access, block_io, persistent, swizzle,
autotuning).

Owns: :class:`RewriteMemo` (a tactic's last rewrite, reused while the incumbent and target stay the same, and
the place where an unexpected failure of a rewrite becomes a "does not apply" with the error, so a bug in
one rewrite never stops a port). The same protection for issue detectors is :func:`stages.base.guarded`.
"""

from __future__ import annotations

from typing import Any

from xeforge.rewrite import NotApplicable


class RewriteMemo:
    """The last rewrite of a tactic, reused while the context is the same (the pipeline calls ``check`` and
    ``propose`` on one incumbent several times; a rewrite costs several libcst passes). ``build`` returns the
    rewrite or raises :class:`NotApplicable`; any other exception is turned into one, with its text."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: tuple[bool, Any] = (False, None)

    def get(self, ctx: Any, build) -> Any:
        device = getattr(ctx, "device", None)
        key = (ctx.source, getattr(ctx, "device_id", None), getattr(device, "kind", None),
               getattr(device, "can_time", None), getattr(device, "cores", None), str(getattr(ctx, "triton", None)),
               id(getattr(ctx, "kb", None)),
               str(getattr(ctx, "run_dir", None)), str(getattr(getattr(ctx, "problem", None), "root", None)))
        if key != self._key:
            try:
                self._value = (True, build(ctx))
            except NotApplicable as exc:
                self._value = (False, exc)
            except Exception as exc:  # a bug in a rewrite must not stop a port: the report shows it instead
                self._value = (False, NotApplicable(f"the rewrite failed on this kernel ({type(exc).__name__}: "
                                                    f"{exc}); it is left as it was"))
            self._key = key
        ok, value = self._value
        if not ok:
            raise value
        return value
