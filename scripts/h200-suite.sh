#!/usr/bin/env bash
# Port (rules engine) and bench a set of problems on every local GPU; the H200 table in BENCHMARKS.md comes
# from this. Usage (repo root, GPU machine):
#   bash scripts/h200-suite.sh OUTDIR [PROBLEM ...]        (default: all 27 problems, order below)
#   RESUME=--resume bash scripts/h200-suite.sh OUTDIR ...  continues an interrupted bench in OUTDIR
#   SEED=docs/h200-suite/bench.json RESUME="--resume --redo" bash scripts/h200-suite.sh OUTDIR PROBLEM ...
#       starts OUTDIR from a committed report (when OUTDIR has none) and ports + benches PROBLEM ... again in it
#   STAGES=dtype,fusion,device_tuning bash scripts/h200-suite.sh OUTDIR ...   ports through those stages only
#   LANES=4 bash scripts/h200-suite.sh OUTDIR ...   four problems at once per GPU, each timing with the GPU alone
#   TIME_BUDGET=4 bash scripts/h200-suite.sh OUTDIR ...   each port's stages get 4 minutes (the rest skipped, said so)
set -uo pipefail
OUTDIR=${1:-bench-out/h200}
shift || true
# default: the whole suite, GEMM + epilogue problems first (the issue-4 targets), then the rest
PROBLEMS=${*:-"$(for k in kb09 kb97 kb41 kb33 kb22 kb64 kb18 kb98 gemm_relu kb30 kb37 kb62 kb75 kb88 kb94; do ls -d kernels/${k}*; done) \
  kernels/gemm_square kernels/gemm_skinny_m kernels/gemm_tall_k kernels/gemv_decode kernels/softmax kernels/layernorm \
  kernels/rmsnorm kernels/swiglu kernels/rotary kernels/vector_add kernels/flash_attn_fwd kernels/flash_attn_fwd_causal"}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ -n "${SEED:-}" ] && [ ! -e "$OUTDIR/bench.json" ]; then
  mkdir -p "$OUTDIR" && cp "$SEED" "$OUTDIR/bench.json" || { echo "h200-suite: cannot seed $OUTDIR from $SEED" >&2; exit 2; }
fi
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
python3 -m xeforge bench $PROBLEMS --device cuda --port --engine rules --budget "${BUDGET:-6}" \
  --workers "${NGPU:-1}" --lanes-per-gpu "${LANES:-1}" --out "$OUTDIR" --runs-dir "${RUNS_DIR:-runs}" --stop-after "${STOP_AFTER:-7}" \
  ${STAGES:+--stages "$STAGES"} ${TIME_BUDGET:+--time-budget "$TIME_BUDGET"} ${RESUME:-}
