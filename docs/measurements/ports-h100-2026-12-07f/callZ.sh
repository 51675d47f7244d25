#!/usr/bin/env bash
# call Z: several-outputs' incumbent at the persistent stage (call U's port before its dispatch: one tile a program,
# 128 x 256, 3 stages), the same with y stored where it is final (the fusion change after 4ba7fa0), and the
# persistent stage's first candidates where the incumbent spills (the tile loop with the epilogue in column halves,
# over each; the first also warp-specialized), benched (no port) at its timed shapes
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 2
mkdir -p /tmp/bw && dpkg -x .deb/bubblewrap*.deb /tmp/bw && export XEFORGE_BWRAP=/tmp/bw/usr/bin/bwrap PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python3 -c 'import torch,triton,sys;print("torch",torch.__version__,"triton",triton.__version__,"python",sys.version.split()[0])'; } > $OUT/gpu.txt 2>&1
python3 scripts/epilogue_problems.py /tmp/ep several-outputs > /dev/null
for d in so_inc so_early so_half so_early_half so_ws; do
  echo "== $d" >> $OUT/log.txt
  timeout 60 python3 -m xeforge bench /tmp/ep/several-outputs-wrapper --device cuda --final "$PWD/.gpucall/$d/{problem}.py" \
    --out /tmp/b_$d >> $OUT/log.txt 2>&1; echo "rc=$?" >> $OUT/log.txt
  cp /tmp/b_$d/bench.md $OUT/bench_$d.md 2>/dev/null
done
grep -h "^==\|final vs\|rc=" $OUT/log.txt
