#!/usr/bin/env bash
# The epilogue-graph problems (issue 33) on a GPU: written by scripts/epilogue_problems.py, then ported (rules
# engine) and benched by scripts/h200-suite.sh against torch.compile of the same Model over F.linear.
# Usage (repo root, GPU machine): bash scripts/h200-epilogues.sh OUTDIR [CASE ...]
# The environment of h200-suite.sh applies (LANES, BUDGET, TIME_BUDGET, STAGES, STOP_AFTER, RESUME). For all nine
# stages give each port room: on an H100 (2026-12-06) eight lanes at TIME_BUDGET=5 left per-shape-config unrun in
# five of the seven ports whose start verified; five lanes at 6 minutes reached it in three of five. Use LANES<=5
# and TIME_BUDGET>=6.
set -uo pipefail
OUTDIR=${1:-bench-out/h200-epilogues}
shift || true
PROBLEMS_DIR=${PROBLEMS_DIR:-/tmp/xeforge-epilogues}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mapfile -t DIRS < <(python3 scripts/epilogue_problems.py "$PROBLEMS_DIR" "$@")
bash scripts/h200-suite.sh "$OUTDIR" "${DIRS[@]}"
