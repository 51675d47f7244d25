"""The device_tuning stage's structural rewrites (``stages/device_tuning*.py``); its launch-parameter search
applies configurations through :mod:`xeforge.rewrite.tiling.configs`.

- :mod:`~xeforge.rewrite.device_tuning.swizzle` — GROUP_SIZE_M grouped tile order.
- :mod:`~xeforge.rewrite.device_tuning.rows` — row batching: ROWS rows per program as a [ROWS, BLOCK] block for a
  kernel that starts one tiny program per row.
- :mod:`~xeforge.rewrite.device_tuning.splitk_plan`, :mod:`~xeforge.rewrite.device_tuning.splitk` — split-K: which
  2D-grid GEMMs (no epilogue) can run SPLIT_K programs per output tile over slices of the K loop, their tile count
  and K steps at a variant; the codemod with fp32 partial tiles summed in order by a second kernel.
- :mod:`~xeforge.rewrite.device_tuning.splitk_tail` — the tail split: whole waves of tiles as written, the tiles of
  a part-filled last wave in slices of K added in order by the slice that ends last (one launch, no second kernel).
- :mod:`~xeforge.rewrite.device_tuning.host_desc` — the tensor descriptors a kernel makes in its body built on the
  host instead and passed in (a pre_hook per configuration sets their block shapes under ``@triton.autotune``).
"""
