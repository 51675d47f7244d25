"""The real-world corpus (``examples/realworld``) as the tests read it: each kernel brought in through
``xeforge new`` from its ``new.yaml``, its dry-run plan per target, and the canonical hand-written problem of the
same kernel under ``kernels/`` whose structural tactics it must get too (issue 32, item 3).

Plans are made in this process (the pipeline's dry run: a trace in a worker, every tactic checked and proposed,
nothing run) and kept per session, so the tests of one file share them.
"""

from __future__ import annotations

import functools
import subprocess
import tempfile
from pathlib import Path

from tests.conftest import ROOT

CORPUS = ROOT / "examples" / "realworld"
TARGETS = ("arc-b580", "h200")
ENTRIES = sorted(p.parent.name for p in CORPUS.glob("*/new.yaml"))

#: the hand-written problem of the same kernel (None: no canonical form in kernels/)
CANONICAL = {
    "rmsnorm_heuristics": "rmsnorm", "fused_add_rmsnorm": "rmsnorm", "layernorm_autograd": "layernorm",
    "online_softmax": "softmax", "log_softmax_rows": "softmax", "cross_entropy_fwd": "softmax",
    "rope_cache": "rotary", "swiglu_fwd": "swiglu", "geglu_tanh": "swiglu", "kv_cache_store": None,
    "flash_attn_fwd_autotune": "flash_attn_fwd_causal", "context_attn_varlen": "flash_attn_fwd_causal",
    "decode_attn_splitkv": None, "paged_decode_attn": None, "gqa_decode_gather": None,
    "matmul_autotune_act": "gemm_square", "persistent_matmul": "gemm_square", "tma_matmul_desc": "gemm_square",
    "matmul_bias_gelu_evenk": "gemm_square", "splitk_matmul_atomic": "gemm_square",
    "batched_matmul_3d": "gemm_square", "matmul_config_by_m": "gemm_square", "w8a8_int8_matmul": "gemm_square",
    "moe_grouped_gemm": None, "int4_dequant_matmul": None,
}
#: the launch search and autotuning: one of them must apply to every kernel on every target
TUNING = {"launch-params", "autotune-from-space"}
#: tactics that are not about the kernel's structure: timing-only choices, and hints that follow from the spec's
#: timed shapes (an odd one), which the corpus entry and its canonical form do not share
NOT_STRUCTURAL = TUNING | {"per-shape-config", "divisibility-hints"}

#: where the corpus form still blocks a tactic its canonical form gets: (entry, tactic) -> what the reason must
#: name (the construct and what stops it). Each is a gap of the tool, listed in the issue's closing note.
KNOWN_GAPS: dict[tuple[str, str], str] = {}

_TMP = Path(tempfile.mkdtemp(prefix="xeforge-realworld-"))


@functools.lru_cache(maxsize=None)
def problem_dir(name: str) -> Path:
    """The problem folder ``xeforge new`` makes from the entry's new.yaml (once per session)."""
    from xeforge.newproblem import build, read_request, write

    yml = CORPUS / name / "new.yaml"
    return write(build(read_request(yml), yml.parent, str(yml)), _TMP / name)


@functools.lru_cache(maxsize=None)
def plan(path: str, target: str) -> dict:
    """tactic -> {applies, reason, patch?} of the dry run of the problem at ``path`` for ``target``."""
    from xeforge.pipeline import Pipeline, PortOptions
    from xeforge.problem import load_problem

    p = load_problem(path)
    out = Pipeline(p, PortOptions(device="cpu", target=target, dry_run=True, runs_dir=_TMP / "runs")).dry_run()
    return {t["name"]: t for s in out["stages"] for t in s["tactics"] if t["name"]}


def applying(tactics: dict) -> set[str]:
    return {n for n, t in tactics.items() if t["applies"]}


def canonical_structural(name: str, target: str) -> set[str]:
    canon = CANONICAL.get(name)
    if canon is None:
        return set()
    return applying(plan(str(ROOT / "kernels" / canon), target)) - NOT_STRUCTURAL


def check_entry(name: str, target: str) -> None:
    """The tactics the issue asks for apply to ``name`` on ``target``; each patch applies."""
    tactics = plan(str(problem_dir(name)), target)
    got = applying(tactics)
    stale = sorted(t for n, t in KNOWN_GAPS if n == name and t in got)
    assert not stale, f"{name}: {stale} apply now: drop them from KNOWN_GAPS"
    assert got & TUNING, {t: tactics[t]["reason"] for t in TUNING if t in tactics}
    for tactic in sorted(canonical_structural(name, target) - got):
        reason = tactics[tactic]["reason"]
        if "already" in reason:  # the kernel has that form itself (persistent, descriptors, a swizzle)
            continue
        gap = KNOWN_GAPS.get((name, tactic))
        assert gap is not None, f"{tactic} applies to the canonical form but not to {name}: {reason}"
        assert gap in reason, f"{name}/{tactic}: the reason no longer names the construct: {reason}"
    for tactic in sorted(got):
        patch = tactics[tactic].get("patch")
        assert patch is not None, f"{tactic}: no patch of the original file"
        if not patch["empty"]:
            proc = subprocess.run(["git", "-C", str(ROOT), "apply", "--check", patch["path"]],
                                  capture_output=True, text=True)
            assert proc.returncode == 0, f"{name}/{tactic}: git apply --check: {proc.stderr}"
