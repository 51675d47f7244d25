"""Analysis: what a kernel file does, observed (the trace) and read (the static model), as facts every stage reads.

- :mod:`xeforge.analysis.trace` — one call of ``Model.forward`` recorded in a worker: every Triton launch with the
  Python call stack down to it (wrapper functions, methods, ``torch.autograd.Function``, custom ops, lambdas), the
  actual dtype / shape / strides of each tensor argument, every constexpr and launch option as really used
  (``@triton.autotune``, ``@triton.heuristics``, META grids, module constants), the resolved grid, and the torch
  ops around the launches; returned as JSON and read here into :class:`~xeforge.analysis.trace.Trace`.
- :mod:`xeforge.analysis.account` — the same call's run-time account below Python (gate 2): the aten operators
  torch's C++ callbacks saw on every thread and, on a GPU, the device kernels the profiler's device activity saw,
  told from what Triton's launcher and autotuner do by ranges the trace recorder opens; and its comparison with the
  starting kernel's.
- :mod:`xeforge.analysis.observe` — the traces of a source at each spec variant (meta device, in the facts worker),
  cached per source.
- :mod:`xeforge.analysis.launches` — the launch facts read from both: block sizes by use, each constexpr's and
  option's value and where it comes from, the kernels that really run, autotune configs.
- :mod:`xeforge.analysis.forward_env` — ``forward`` read statically (symbolic shapes, bindings and canonical sources
  of what it passes to a launch), for the fusion rewrites, which write code into forward's statements; dtypes are
  the trace's.
- :mod:`xeforge.kernel_model` — the static model of the source (gate 1, and what needs no execution);
  :mod:`xeforge.host_refs` reads what its host code names from torch (gate 1's whole-file reading).
"""
