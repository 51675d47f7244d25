#!/usr/bin/env python3
"""Problem folders of the epilogue-graph cases (issue 33) for a GPU bench: each case of tests/test_fusion_graph.py's
GRAPHS (residuals, gates reading their input, in-place ops, where, ops torch decomposes, a parameter only
the trace knows, the input as residual) and SPLIT_READ_BACK (a row mean or max read back over rows no tile
covers: the split reduction and its generated second pass) over the test's GEMM + bias wrapper, in the wrapper and
the direct style, with bf16 bench shapes: a large one (4096 x 4096 x 4096) and a decode-sized one (M = 16). The
reference is the same Model over torch's F.linear. scripts/h200-epilogues.sh ports and benches them.

Usage (repo root): python3 scripts/epilogue_problems.py OUTDIR [CASE ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_fusion_graph import GRAPHS, SPEC, SPLIT_READ_BACK, _problem  # noqa: E402  (the cases: the test's)

BENCH = """bench-gpu:
  - {params: [x], dtype: bfloat16, dims: {M: 4096, K: 4096, N: 4096}, flop: "2*M*N*K", bytes: "2*(M*K + N*K + M*N)"%s}
bench-gpu-1:
  - {params: [x], dtype: bfloat16, dims: {M: 16, K: 4096, N: 4096}, flop: "2*M*N*K", bytes: "2*(M*K + N*K + M*N)"%s}
"""
#: cases whose own bf16 semantics need a wider atol than the bf16 default (1e-2) at the bench shapes. Their starts
#: round y to bf16 before an op that nearly cancels it (x + relu(y), y * s - mean, exp(y - max)); on an H100
#: (2026-12-06) each start missed the float64 oracle at a few elements where the reference run in bf16 misses it too:
#: the-input-as-residual by 0.057 at -1.68, scaled-then-centred by 0.50 at 48.0, softmax-numerator by 0.061 at 0.998.
#: The verifier's "own rounding" cause names such a miss and the atol it needs. On the CPU (torch 2.13, 2026-12-06:
#: each reference run in bf16 against float64, seeds 0 and 1, normal and outlier inputs, both bench shapes) the
#: references needed at most 0.027, 0.018 and 0.1005 (softmax-numerator, outliers, 4096^3): hence 0.15 there.
#: scaled-then-centred's H100 miss (0.50 at 48.0, where a bf16 step is 0.25) left 0.08 under 0.1 + 1% of 48: 0.2.
#: decomposed-ops' start missed by 0.0235 and 0.0248 on the H100 (2026-12-06, second session: its lerp towards x and
#: elu of a bf16 y), where the reference run in bf16 needed 0.0108-0.0135; the verifier proposed 0.016 and 0.02.
#: At 0.03 (H100, 2026-12-06, third session) it missed again on outlier inputs at 4096^3, by 0.0367 and 0.0377,
#: where the reference run in bf16 needed 0.037 and 0.0364; the verifier proposed 0.055 and 0.056: hence 0.06.
BENCH_ATOL = {"the-input-as-residual": 0.1, "scaled-then-centred": 0.2, "softmax-numerator": 0.15,
              "decomposed-ops": 0.06}


def _atol(name: str) -> str:
    return f", atol: {BENCH_ATOL[name]}" if name in BENCH_ATOL else ""


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):  # no folder, or an option (--help): the usage, nothing written
        print(__doc__, file=sys.stderr)
        return 0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2
    out = Path(sys.argv[1])
    cases = {**{n: b for n, (b, _) in GRAPHS.items()}, **{n: b for n, (b, _) in SPLIT_READ_BACK.items()}}
    names = sys.argv[2:] or sorted(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        print(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(sorted(cases))}", file=sys.stderr)
        return 2
    for name in names:
        for style in ("wrapper", "direct"):
            d = out / f"{name}-{style}"
            d.mkdir(parents=True, exist_ok=True)
            _problem(d, cases[name], style)
            (d / "spec.yaml").write_text(f"description: \"GEMM + bias, then the epilogue graph '{name}' ({style} "
                                         f"style)\"\nprecision: tf32\n{SPEC}{BENCH % ((_atol(name),) * 2)}")
            print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
