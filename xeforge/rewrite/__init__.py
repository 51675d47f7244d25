"""Source rewrites behind the rules engine's tactics (the tactics themselves live in ``stages/``), grouped by the
stage they serve.

Shared plumbing:

- :mod:`xeforge.rewrite.cst_tools` — libcst plumbing: parse with positions, edit statements by line, add
  kernel parameters and launch arguments, rename names, remove functions. Formatting and comments survive.
- :mod:`xeforge.rewrite.context` — one parse of the kernel file shared by a rewrite (ast, libcst, and
  :mod:`xeforge.analysis.forward_env`'s abstract ``forward``).
- :mod:`xeforge.rewrite.tiling` (package) — the model of a tiled kernel (program ids, tile offsets, K loop, masks)
  and what the stages from memory_access on build on it: grid and launch edits (``grid``, ``edit``), applying a
  tile configuration (``configs``), the "rewrite, then also with the KB's top tiles" candidates (``tactics``), and
  the [BM, BN] sub-tile views of block_io (``subtile``).

By stage:

- dtype — :mod:`xeforge.rewrite.dtype`: the precision-contract rewrites around ``tl.dot`` and fp64;
  :mod:`xeforge.rewrite.dtype_narrow`: fp32 buffers between Triton kernels stored in the inputs' dtype.
- fusion — :mod:`xeforge.rewrite.fusion` (package): inlining calls into ``forward``, the epilogue translation
  table, the fusions, GroupNorm and combined-partials kernels.
- memory_access — :mod:`xeforge.rewrite.memory`: coalescing and int32-overflow analysis, the int64 cast.
- block_io — :mod:`xeforge.rewrite.blockio`: tensor descriptors / block pointers with a pointer fallback.
- persistent — :mod:`xeforge.rewrite.persistent`: the persistent tile loop sized from the device's core count.
- device_tuning — :mod:`xeforge.rewrite.device_tuning` (package): grouped tile order, row batching, split-K.
- autotuning — :mod:`xeforge.rewrite.autotune`: the ``@triton.autotune`` decorator from verified configurations,
  pinning and extending an existing one.

(``memory``'s static evaluation of ``forward`` overlaps ``forward_env``, and ``tiling.edit`` overlaps
``cst_tools``: known, to be merged.)

Each of these rewrites either returns new source or raises :class:`NotApplicable` with the reason.
"""

from __future__ import annotations


class NotApplicable(Exception):
    """A rewrite does not apply to this source; ``str(exc)`` says why (shown to the user as is)."""
