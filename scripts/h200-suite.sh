#!/usr/bin/env bash
# Port (rules engine) and bench a set of problems on every local GPU; the H200 table in BENCHMARKS.md comes
# from this. Usage (repo root, GPU machine):
#   bash scripts/h200-suite.sh OUTDIR [PROBLEM ...]        (default problems below)
#   RESUME=--resume bash scripts/h200-suite.sh OUTDIR ...  continues an interrupted bench in OUTDIR
set -uo pipefail
OUTDIR=${1:-bench-out/h200}
shift || true
PROBLEMS=${*:-"kernels/gemm_relu kernels/kb09_matmul_subtract_multiply_relu kernels/kb97_matmul_batchnorm_biasadd_divide_swish kernels/kb41_gemm_batchnorm_gelu_relu kernels/kb33_gemm_scale_batchnorm kernels/kb37_matmul_swish_sum_groupnorm kernels/softmax kernels/gemm_square"}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
python3 -m xeforge bench $PROBLEMS --device cuda --port --engine rules --budget "${BUDGET:-6}" \
  --workers "${NGPU:-1}" --out "$OUTDIR" --runs-dir "${RUNS_DIR:-runs}" --stop-after "${STOP_AFTER:-7}" ${RESUME:-}
