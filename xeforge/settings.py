"""All tunable defaults of xeforge in one frozen dataclass, overridable from the environment.

Owns: timeouts, correctness rounds, timing repetitions, noise margins, search budgets. Every number the
verifier or the pipeline uses lives here, with the environment variable that overrides it; parsing is
strict and names the variable and what it expects.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields

from xeforge.errors import UsageError


@dataclass(frozen=True)
class Settings:
    # gate 0 — isolation
    compile_timeout_s: float = field(default=120.0, metadata={"env": "XEFORGE_COMPILE_TIMEOUT"})
    run_timeout_s: float = field(default=300.0, metadata={"env": "XEFORGE_RUN_TIMEOUT"})
    max_tensor_file_gib: float = field(default=16.0, metadata={"env": "XEFORGE_MAX_TENSOR_FILE_GIB"})  # from a worker
    sandbox: str = field(default="auto", metadata={"env": "XEFORGE_SANDBOX", "choices": ("auto", "require", "off")})
    worker_memory_gib: float = field(default=0.0, metadata={"env": "XEFORGE_WORKER_MEMORY_GIB",
                                                                         "zero_ok": True})  # 0: 3/4 of RAM
    worker_cpu_s: float = field(default=6 * 3600.0, metadata={"env": "XEFORGE_WORKER_CPU_S"})  # a worker's lifetime
    max_log_mib: float = field(default=16.0, metadata={"env": "XEFORGE_MAX_LOG_MIB"})  # a worker's captured output
    # gate 2 — correctness
    correctness_rounds: int = field(default=5, metadata={"env": "XEFORGE_ROUNDS"})
    ragged_shapes: bool = field(default=True, metadata={"env": "XEFORGE_RAGGED"})
    # the run-time account below Python (xeforge.analysis.account); off only where its cost is measured
    # (scripts/h200-hostile.py): no environment variable turns it off
    runtime_account: bool = True
    fp32_tol: float = 1e-4
    half_tol: float = 1e-2
    # float32 on a GPU where the spec's precision is tf32: a tl.dot on fp32 operands runs as TF32 by default
    # (10-bit mantissa), torch's own TF32 tests use 1e-2 too; the interpreter computes in fp32 and keeps fp32_tol
    tf32_tol: float = 1e-2
    # gate 3 — performance
    warmup_calls: int = field(default=3, metadata={"env": "XEFORGE_WARMUP"})
    timed_pairs: int = field(default=20, metadata={"env": "XEFORGE_TIMED_PAIRS"})
    min_noise_margin: float = field(default=0.02, metadata={"env": "XEFORGE_MIN_MARGIN"})
    speedup_flag: float = 10.0  # speedups above this are flagged in the report
    rotation_budget_fraction: float = 0.25  # of free device memory, for rotated input buffers
    # search
    tuning_budget: int = field(default=24, metadata={"env": "XEFORGE_TUNING_BUDGET"})  # hardware evaluations per tactic
    cpu_tuning_budget: int = field(default=2, metadata={"env": "XEFORGE_CPU_TUNING_BUDGET"})
    # a port's wall-clock budget in minutes, checked before each stage: the stages it leaves are skipped (saying
    # so) and the final gate runs on the best kernel so far; --resume with a larger budget continues. 0: no limit
    port_minutes: float = field(default=0.0, metadata={"env": "XEFORGE_PORT_MINUTES", "zero_ok": True})
    # verifiers that check a stage's candidates (gates 1, 0, 2) side by side before gate 3 times them one by one:
    # the port's own and check_lanes - 1 more (xeforge.check_lanes); 1: the port's verifier alone
    check_lanes: int = field(default=1, metadata={"env": "XEFORGE_CHECK_LANES"})
    # diagnosis — keep each verified source's compiled kernels (IRs, metadata) in the run: worker/compiled/<hash>/
    keep_compiled: bool = field(default=False, metadata={"env": "XEFORGE_KEEP_COMPILED"})

    def replace(self, **changes) -> "Settings":
        return dataclasses.replace(self, **changes)


def _parse(name: str, raw: str, f: dataclasses.Field):
    """One environment value, parsed strictly: the type, the allowed values, and numbers > 0 (>= 0 where the
    field says ``zero_ok``; a timeout of -5 s or a budget of 0 rounds is a mistake, not a setting)."""
    typ = type(f.default)
    choices = f.metadata.get("choices")
    if choices is not None:
        value = raw.strip().lower()
        if value not in choices:
            raise UsageError(f"environment variable {name}", f"{raw!r} is not one of {', '.join(choices)}",
                             f"set {name} to one of {', '.join(choices)}")
        return value
    try:
        if typ is bool:
            low = raw.strip().lower()
            if low in {"1", "true", "yes", "on"}:
                return True
            if low in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        value = typ(raw.strip())
    except ValueError:
        expected = {bool: "one of 1/0/true/false", int: "an integer", float: "a number"}[typ]
        raise UsageError(f"environment variable {name}", f"{raw!r} is not {expected}", f"set {name} to {expected}") from None
    zero_ok = f.metadata.get("zero_ok", False)
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise UsageError(f"environment variable {name}", f"{raw!r} is out of range (it must be {bound})",
                         f"set {name} to a number {bound}, or unset it for the default ({f.default})")
    return value


def load_settings(env: dict[str, str] | None = None) -> Settings:
    env = os.environ if env is None else env
    values = {}
    for f in fields(Settings):
        var = f.metadata.get("env")
        if var and var in env:
            values[f.name] = _parse(var, env[var], f)
    return Settings(**values)
