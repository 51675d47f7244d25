#!/usr/bin/env bash
# call A: four split/several-output epilogue graphs + gemm_tall_k + gemm_square, six ports at once
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; } > $OUT/gpu.txt 2>&1
python3 scripts/epilogue_problems.py /tmp/ep ${CASES:-centred several-outputs softmax-numerator scaled-then-centred} > /tmp/dirs.txt
S=$(date +%s)
LANES=${LANES:-6} BUDGET=3 TIME_BUDGET=${TB:-7} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT ${LIMIT:-540} bash scripts/h200-suite.sh /tmp/bo \
  $(grep -- -wrapper /tmp/dirs.txt) ${EXTRA:-kernels/gemm_tall_k kernels/gemm_square} > $OUT/log.txt 2>&1
echo "rc=$? after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
ls -la $OUT
