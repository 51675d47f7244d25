#!/usr/bin/env bash
# The port results call X benched (--final): the latest port of each problem, taken from the calls' archives
# into .gpucall/finals2/{problem}.py (run from the repository root)
set -eu
mkdir -p .gpucall/finals2
x() { tar xzf "docs/measurements/$1/ports.tgz" -O "./$2/$3/final/kernel.py" > ".gpucall/finals2/$2.py"; }
x ports-h100-2026-12-07c/G gemv_decode 20261207-120857
x ports-h100-2026-12-07b/E gemm_square 20261207-091737
x ports-h100-2026-12-07b/D gemm_tall_k 20261207-090458
x ports-h100-2026-12-07b/D gemm_skinny_m 20261207-090458
x ports-h100-2026-12-07b/E gemm_relu 20261207-091737
x ports-h100-2026-12-07b/E kb09_matmul_subtract_multiply_relu 20261207-091736
x ports-h100-2026-12-07b/D kb22_matmul_scale_residualadd_clamp_logsumexp_mish 20261207-090459
x ports-h100-2026-12-07d/T kb41_gemm_batchnorm_gelu_relu 20261207-152951
x ports-h100-2026-12-07e/V centred-wrapper 20261207-171138
x ports-h100-2026-12-07e/V scaled-then-centred-wrapper 20261207-171138
x ports-h100-2026-12-07e/V softmax-numerator-wrapper 20261207-171138
x ports-h100-2026-12-07e/U several-outputs-wrapper 20261207-170306
x suite-shapes-2026-12-06/B decomposed-ops-wrapper 20261206-222049
x suite-shapes-2026-12-06/B the-input-as-residual-wrapper 20261206-222049
