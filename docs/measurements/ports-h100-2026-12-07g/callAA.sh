#!/usr/bin/env bash
# call AA (prepared for the next session): gemm_square, gemm_tall_k and centred ported at the current code (three
# lanes): per-shape-config's odd class (f25bce7), split-K over a halved store (827156c), the persistent loop's
# follow-up and the second launch's search, none measured yet
S=$(date +%s); END=${END:-560}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; echo "code $(cat .gpucall/HEAD) (working tree)"; } > $OUT/gpu.txt 2>&1
python3 scripts/epilogue_problems.py /tmp/ep centred > /tmp/dirs.txt
LEFT=$(( END - 20 - ($(date +%s) - S) ))
LANES=3 BUDGET=3 TIME_BUDGET=${TB:-5} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT $LEFT bash scripts/h200-suite.sh /tmp/bo \
  kernels/gemm_square kernels/gemm_tall_k $(grep -- -wrapper /tmp/dirs.txt) > $OUT/log.txt 2>&1
echo "ports rc=$? limit $LEFT s, after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
tail -5 $OUT/log.txt
