#!/usr/bin/env bash
# The real-world corpus on a GPU: each examples/realworld/<name>/new.yaml brought in with `xeforge new`, then
# ported (rules engine) and benched by scripts/h200-suite.sh. The corpus table in BENCHMARKS.md comes from this.
# Usage (repo root, GPU machine):
#   bash scripts/h200-corpus.sh OUTDIR [NAME ...]     (default: every corpus entry)
#   RESUME=--resume bash scripts/h200-corpus.sh OUTDIR ...   continues an interrupted bench in OUTDIR
# The environment of h200-suite.sh applies (LANES, BUDGET, TIME_BUDGET, STAGES, STOP_AFTER).
set -uo pipefail
OUTDIR=${1:-bench-out/h200-corpus}
shift || true
NAMES=${*:-$(for f in examples/realworld/*/new.yaml; do basename "$(dirname "$f")"; done)}
PROBLEMS_DIR=${PROBLEMS_DIR:-/tmp/xeforge-corpus}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
DIRS=()
for n in $NAMES; do
  python3 -m xeforge new "examples/realworld/$n/new.yaml" -o "$PROBLEMS_DIR/$n" --force --json >/dev/null \
    || { echo "h200-corpus: xeforge new failed for $n" >&2; continue; }
  DIRS+=("$PROBLEMS_DIR/$n")
done
bash scripts/h200-suite.sh "$OUTDIR" "${DIRS[@]}"
