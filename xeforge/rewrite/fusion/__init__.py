"""The fusion stage's rewrites (``stages/fusion.py``): fewer launches and round trips through memory.

- :mod:`~xeforge.rewrite.fusion.inline` — the calls that lead to a launch (wrappers, launcher methods, autograd
  Functions, ``torch.library`` ops) inlined into ``forward``, so the fusions reach launches written behind them.
- :mod:`~xeforge.rewrite.fusion.tl_ops` — forward statements translated to ``tl`` code on a tile value (operands,
  the values a later op reads again), and the row reductions read back over the row (``y - y.mean(1,
  keepdim=True)``, softmax).
- :mod:`~xeforge.rewrite.fusion.decompose` — the one lowering of elementwise math: every torch op reduced by
  torch's decompositions to ATen primitives, each primitive written as ``tl`` code from one table.
- :mod:`~xeforge.rewrite.fusion.tile` — the shapes fusion recognises: a kernel's final tile store and an
  elementwise consumer kernel.
- :mod:`~xeforge.rewrite.fusion.rewrites` — the fusions (consumer kernel into the producer's store, trailing torch
  ops into the epilogue, row reductions when one tile covers the row, split into per-tile partials when none does).
- :mod:`~xeforge.rewrite.fusion.norm` — ``F.group_norm`` and what follows it as one generated kernel.
- :mod:`~xeforge.rewrite.fusion.combine` — a row reduction of partials and the small ops after it as one generated
  kernel.
- :mod:`~xeforge.rewrite.fusion.common` — what those three share (reductions, operands read from ``forward``, the
  edit of ``forward``'s result and the generated kernel); it imports none of them.
"""
