#!/usr/bin/env bash
# call G: the tail-split probe, then six ports at once (gemm_square, gemv_decode, kb41, three read-back epilogue graphs)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; git log -1 --format=%h 2>/dev/null; } > $OUT/gpu.txt 2>&1
S=$(date +%s)
timeout 100 python3 .gpucall/tail_probe.py > $OUT/probe.txt 2>&1; echo "probe rc=$? after $(( $(date +%s) - S )) s" >> $OUT/probe.txt
python3 scripts/epilogue_problems.py /tmp/ep ${CASES:-centred several-outputs softmax-numerator} > /tmp/dirs.txt
LANES=${LANES:-6} BUDGET=3 TIME_BUDGET=${TB:-6} STOP_AFTER=1 RUNS_DIR=/tmp/xr timeout -s INT ${LIMIT:-450} bash scripts/h200-suite.sh /tmp/bo \
  ${P:-kernels/gemm_square kernels/gemv_decode kernels/kb41_gemm_batchnorm_gelu_relu} $(grep -- -wrapper /tmp/dirs.txt) > $OUT/log.txt 2>&1
echo "rc=$? after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bo/bench.json /tmp/bo/bench.md $OUT/ 2>/dev/null
(cd /tmp/xr && tar czf $OUT/ports.tgz $(find . -name 'report.md' -o -name 'report.json' -o -path '*/final/kernel.py' | head -200)) 2>/dev/null
ls -la $OUT
