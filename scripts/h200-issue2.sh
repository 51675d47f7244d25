#!/usr/bin/env bash
# The issue-2 measurements on a CUDA GPU: env, A/A test, verify and port of the bundled GEMM problem.
# Usage (repo root, GPU machine): bash scripts/h200-issue2.sh OUTDIR
set -uo pipefail
OUTDIR=${1:-gpu-out}
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PY:-python3}
$PY -m xeforge env --device cuda --json > "$OUTDIR/env.json"; $PY -m xeforge env --device cuda
$PY -m pytest tests/test_timing.py -q -rs -k aa 2>&1 | tail -3
$PY -m xeforge aa kernels/gemm_relu --device cuda --repeats 3 --runs-dir /tmp/xf-runs --json > "$OUTDIR/aa.json"
$PY -m xeforge verify kernels/gemm_relu --device cuda --runs-dir /tmp/xf-runs --json > "$OUTDIR/verify.json"
$PY -m xeforge port kernels/gemm_relu --device cuda --runs-dir /tmp/xf-runs ${PORT_ARGS:-} --json > "$OUTDIR/port.json"
run=$(ls -d /tmp/xf-runs/gemm_relu/*/ | tail -1)
cp "$run/report.md" "$OUTDIR/port-report.md"
cp "$run/final/kernel.py" "$OUTDIR/port-final-kernel.py"
