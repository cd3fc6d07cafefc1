#!/usr/bin/env bash
# On the device (after .gpu-stack/install.sh b): GPU tests, the forward A/B benchmark and
# the launch-parameter sweep, each under its own time limit, logs and reports into $OUT.
# Usage: bash scripts/device_forward.sh [tests] [bench] [tune]   (default: all three)
set -uo pipefail
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
steps=${*:-tests bench tune}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/device.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/device.txt"
for step in $steps; do
  case $step in
    tests) timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -40 | tee "$OUT/gpu_tests.log" ;;
    bench) timeout ${BENCH_TIMEOUT:-300} python3 -m tbe_plugin.benchmarks.forward --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tail -60 | tee "$OUT/bench.log" ;;
    selfcheck) timeout 200 python3 -m tbe_plugin.benchmarks.forward --self-check --configs b8192,zipf1.15 --out "$OUT/selfcheck" 2>&1 | tail -20 | tee "$OUT/selfcheck.log" ;;
    tune) timeout ${TUNE_TIMEOUT:-240} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" ${TUNE_ARGS:-} 2>&1 | tail -30 | tee "$OUT/tune.log" ;;
  esac
done
