#!/usr/bin/env bash
# Issue 35 on one GPU: what Ray adds to a port (scripts/ray_overhead.py: the local port against `--cluster ray` on a
# head started on this host), then one launch search checked by one verifier or by two side by side
# (`--check-lanes 1` / `2`, interleaved, REPEATS times). Usage (repo root, a CUDA machine with ray importable):
#   bash scripts/gpu-scale.sh OUTDIR
# Writes OUTDIR/ray-overhead.{json,md}, OUTDIR/check-lanes.jsonl (one line per port: lanes, wall seconds, trials,
# the port's exit code) and OUTDIR/reports.tgz (each port's report.md). RAY_STAGES (default: all) and RAY_PROBLEMS
# pick the Ray ports; LANE_PROBLEM, LANE_STAGES and LANES_LIST (default "1 2") the lanes'; RAY_TIMEOUT (seconds)
# caps the Ray part.
set -uo pipefail
OUT=${1:?usage: bash scripts/gpu-scale.sh OUTDIR}
mkdir -p "$OUT" /tmp/xeforge-scale
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# shellcheck disable=SC2086
# SIGINT: the script stops its Ray head on the way out
timeout -s INT "${RAY_TIMEOUT:-3600}" python3 scripts/ray_overhead.py /tmp/xeforge-scale/ray --device cuda \
  ${RAY_STAGES:+--stages "$RAY_STAGES"} \
  --repeats "${RAY_REPEATS:-1}" ${RAY_PROBLEMS:-kernels/gemm_relu kernels/softmax}
cp /tmp/xeforge-scale/ray/ray-overhead* /tmp/xeforge-scale/ray/ray-head.log "$OUT"/ 2>/dev/null
for r in $(seq 1 "${REPEATS:-2}"); do
  for k in ${LANES_LIST:-1 2}; do
    run=/tmp/xeforge-scale/lanes-$k-$r
    t0=$(date +%s.%N)
    python3 -m xeforge port "${LANE_PROBLEM:-kernels/gemm_relu}" --device cuda --engine rules \
      --stages "${LANE_STAGES:-device_tuning}" --check-lanes "$k" --run-dir "$run" --json > "$run.json"
    rc=$?
    python3 - "$k" "$r" "$t0" "$(date +%s.%N)" "$rc" "$run" >> "$OUT/check-lanes.jsonl" <<'PY'
import json, pathlib, sys
k, r, t0, t1, rc, run = sys.argv[1:]
trials = len(list(pathlib.Path(run, "trials").glob("*/meta.json")))
print(json.dumps({"lanes": int(k), "repeat": int(r), "wall_s": round(float(t1) - float(t0), 2), "trials": trials,
                  "rc": int(rc)}))
PY
  done
done
(cd /tmp/xeforge-scale && find . -name report.md | tar czf "$OUT/reports.tgz" -T -)
