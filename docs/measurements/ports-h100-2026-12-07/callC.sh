#!/usr/bin/env bash
# call C: bench (no port) gemm_square's call-A port result + the wave-tail split, and three 312c465 port results
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; } > $OUT/gpu.txt 2>&1
S=$(date +%s)
timeout -s INT ${LIMIT:-220} python3 -m xeforge bench ${P:-kernels/gemm_square kernels/kb09_matmul_subtract_multiply_relu kernels/gemm_relu kernels/gemv_decode} \
  --device cuda --final "$PWD/.gpucall/finals/{problem}.py" --out /tmp/bc > $OUT/log.txt 2>&1
echo "rc=$? after $(( $(date +%s) - S )) s" >> $OUT/log.txt
cp /tmp/bc/bench.json /tmp/bc/bench.md $OUT/ 2>/dev/null
ls -la $OUT
