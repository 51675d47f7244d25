#!/usr/bin/env bash
# call Z2: several-outputs' persistent-stage incumbent and its early-store form benched in one run (call Z lost the
# first to a cold 60 s limit), then several-outputs and gemm_tall_k ported at the current code (2 lanes); ends by END s
S=$(date +%s); END=${END:-590}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; git log --oneline -1; } > $OUT/gpu.txt 2>&1
python3 scripts/epilogue_problems.py /tmp/ep several-outputs > /tmp/dirs.txt
for d in so_inc so_early; do
  echo "== $d" >> $OUT/log_z.txt
  timeout 110 python3 -m xeforge bench /tmp/ep/several-outputs-wrapper --device cuda --final "$PWD/.gpucall/$d/{problem}.py" \
    --out /tmp/b_$d >> $OUT/log_z.txt 2>&1; echo "rc=$? at $(( $(date +%s) - S )) s" >> $OUT/log_z.txt
  cp /tmp/b_$d/bench.md $OUT/bench_$d.md 2>/dev/null
done
LEFT=$(( END - 20 - ($(date +%s) - S) ))
LANES=2 BUDGET=3 TIME_BUDGET=${TB:-5} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT $LEFT bash scripts/h200-suite.sh /tmp/bo \
  $(grep -- -wrapper /tmp/dirs.txt) kernels/gemm_tall_k > $OUT/log.txt 2>&1
echo "ports rc=$? limit $LEFT s, after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
grep -h "^==\|final vs\|rc=" $OUT/log_z.txt
tail -5 $OUT/log.txt
