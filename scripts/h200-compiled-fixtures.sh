#!/usr/bin/env bash
# Verify bundled problems on the local GPU with their compiled kernels kept (XEFORGE_KEEP_COMPILED=1) and copy
# what the worker wrote (meta.json and the IR texts) to OUTDIR/<problem>/, beside `xeforge verify --json`'s
# output: the fixtures tests/fixtures/compiled/ come from this (the recognizers' and diagnoses' tests).
# Usage (repo root, GPU machine): bash scripts/h200-compiled-fixtures.sh OUTDIR PROBLEM_DIR[=CANDIDATE.py] ...
#   (with =CANDIDATE.py the candidate's kernels are kept, saved as <problem>-candidate)
set -uo pipefail
OUTDIR=$1
shift
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 XEFORGE_KEEP_COMPILED=1 XEFORGE_ROUNDS=${XEFORGE_ROUNDS:-1}
for arg in "$@"; do
  p=${arg%%=*}
  name=$(basename "$p")
  cand=()
  if [ "$arg" != "$p" ]; then cand=(--candidate "${arg#*=}"); name="$name-candidate"; fi
  mkdir -p "$OUTDIR/$name"
  python3 -m xeforge verify "$p" "${cand[@]}" --device cuda --json --runs-dir "$OUTDIR/runs" > "$OUTDIR/$name/verify.json" \
    2> "$OUTDIR/$name/verify.log"
  echo "$name: rc $?" >&2
  kept=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print((d.get('diagnosis') or {}).get('kept',''))" \
    "$OUTDIR/$name/verify.json" 2>/dev/null)
  [ -n "$kept" ] && [ -d "$kept" ] && cp -r "$kept"/. "$OUTDIR/$name/"
done
