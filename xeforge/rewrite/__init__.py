"""Source rewrites behind the rules engine's tactics (the tactics themselves live in ``stages/``).

This package holds the analysis and libcst edits of several stages; each module says which. The dtype and
fusion stages (``stages/dtype.py``, ``stages/fusion.py``) use:

- :mod:`xeforge.rewrite.cst_tools` — libcst plumbing: parse with positions, edit statements by line, add
  kernel parameters and launch arguments, rename names, remove functions. Formatting and comments survive.
- :mod:`xeforge.rewrite.context` — one parse of the kernel file shared by a rewrite (ast, libcst, forward).
- :mod:`xeforge.rewrite.forward_env` — what ``Model.forward`` holds: the symbolic shape (spec dim names) and
  element dtype of each tensor it passes to a launch, per variant; the Model's parameters and scalars.
- :mod:`xeforge.rewrite.inline` — the calls that lead to a launch (wrappers, launcher methods, autograd Functions,
  ``torch.library`` ops) inlined into ``forward``, so the fusions reach launches written behind them.
- :mod:`xeforge.rewrite.tl_ops` — the table of elementwise torch ops that translate to ``tl`` code.
- :mod:`xeforge.rewrite.fusion_tile` — the shapes fusion recognises: a kernel's final tile store and an
  elementwise consumer kernel.
- :mod:`xeforge.rewrite.fusion_rewrites` — the fusions (consumer kernel into the producer's store,
  trailing torch ops into the epilogue, row reductions when one tile covers the row, split into per-tile
  partials when none does).
- :mod:`xeforge.rewrite.fusion_norm` — ``F.group_norm`` and what follows it as one generated kernel.
- :mod:`xeforge.rewrite.fusion_combine` — a row reduction of partials and the small ops after it as one generated
  kernel.
- :mod:`xeforge.rewrite.fusion_common` — what those three share (reductions, operands read from ``forward``, the
  edit of ``forward``'s result and the generated kernel); it imports none of them.
- :mod:`xeforge.rewrite.dtype_rewrites` — the precision-contract rewrites around ``tl.dot`` and fp64.

The memory_access, block_io, persistent, device_tuning (split-K, swizzle, row batching) and autotuning stages use:

- :mod:`xeforge.rewrite.tiling`, :mod:`~xeforge.rewrite.tiling_grid`, :mod:`~xeforge.rewrite.tiling_edit` — the model
  of a tiled kernel (program ids, tile offsets, K loop, masks) and the grid / launch edits built on it.
- :mod:`xeforge.rewrite.tiling_configs`, :mod:`~xeforge.rewrite.tiling_tactics` — applying a tile configuration
  and the shared "rewrite, then also with the KB's top tiles" candidate generation.
- :mod:`xeforge.rewrite.tiling_swizzle` — GROUP_SIZE_M grouped tile order.
- :mod:`xeforge.rewrite.blockio` — tensor descriptors / block pointers with a pointer fallback.
- :mod:`xeforge.rewrite.persistent` — the persistent tile loop sized from the device's core count.
- :mod:`xeforge.rewrite.autotune` — the ``@triton.autotune`` decorator from verified configurations.
- :mod:`xeforge.rewrite.memory` — coalescing and int32-overflow analysis, the int64 cast.
- :mod:`xeforge.rewrite.rows` — row batching (device_tuning): ROWS rows per program as a [ROWS, BLOCK] block
  for a kernel that starts one tiny program per row.
- :mod:`xeforge.rewrite.splitk_plan`, :mod:`~xeforge.rewrite.splitk` — split-K (device_tuning): which 2D-grid GEMMs
  (no epilogue) can run SPLIT_K programs per output tile over slices of the K loop, their tile count and K
  steps at a variant; the codemod with fp32 partial tiles summed in order by a second kernel.

(``memory``'s static evaluation of ``forward`` overlaps ``forward_env``, and ``tiling_edit`` overlaps ``cst_tools``:
known, to be merged.)

Each of these rewrites either returns new source or raises :class:`NotApplicable` with the reason.
"""

from __future__ import annotations


class NotApplicable(Exception):
    """A rewrite does not apply to this source; ``str(exc)`` says why (shown to the user as is)."""
