#!/usr/bin/env bash
# `xeforge verify` (gates 0-2; gate 3 as an A/A check) on every problem's starting kernel, spread over the local
# GPUs. Writes OUTDIR/verify-suite.tsv (problem, correct, gate-2 summary).
# Usage (repo root, GPU machine): bash scripts/gpu-verify-suite.sh OUTDIR [PROBLEM_DIR ...]
set -uo pipefail
OUTDIR=${1:-gpu-out}
shift || true
mkdir -p "$OUTDIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PROBLEMS=(${@:-$(ls -d kernels/*/)})
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); NGPU=${NGPU:-1}
lane() {
  local gpu=$1; shift
  for p in "$@"; do
    name=$(basename "$p")
    CUDA_VISIBLE_DEVICES=$gpu python3 -m xeforge verify "$p" --device cuda --runs-dir /tmp/xf-verify --json \
      > "/tmp/xf-verify-$name.json" 2>"/tmp/xf-verify-$name.err"
    python3 - "$name" "/tmp/xf-verify-$name.json" "/tmp/xf-verify-$name.err" <<'PY' >> "$OUTDIR/verify-suite.tsv"
import json, sys
name, out, err = sys.argv[1:]
try:
    v = json.load(open(out))
    g2 = next((g for g in v["gates"] if g["gate"] == "2-correctness"), {"summary": v["feedback"]})
    print(f"{name}\t{v['correct']}\t{g2['summary'][:300]}")
except Exception as exc:
    print(f"{name}\tERROR\t{open(err).read()[-300:]!r}")
PY
  done
}
for ((g = 0; g < NGPU; g++)); do
  mine=()
  for ((i = g; i < ${#PROBLEMS[@]}; i += NGPU)); do mine+=("${PROBLEMS[$i]}"); done
  lane "$g" "${mine[@]}" &
done
wait
sort "$OUTDIR/verify-suite.tsv" -o "$OUTDIR/verify-suite.tsv"
cat "$OUTDIR/verify-suite.tsv"
