#!/usr/bin/env bash
# One device call (~8 minutes) for the changes that wait on the GPU: every GPU test of the
# kernels (the backward's positions window, the graphs default, the forward's PREFETCH); the
# forward's launch sweep with PREFETCH on production and fixed-length tables (the heuristic
# is then chosen from it); the backward's per-kernel profile under the default launch.
# Results under $OUT: device.txt, gpu_tests.log, tune_forward.json, tune.log,
# profile_backward.json, run.log. Then scripts/device_head.sh with TESTS=0 TUNE=0 measures
# the suite and the end-to-end step.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_sweep.sh
source "$(dirname "$0")/device_common.sh" "kernel changes untimed so far"
echo "=== gpu tests $(date +%T)"
[ "${TESTS:-1}" = 0 ] || timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider -rs -x \
  tests/ops tests/test_fbgemm_parity.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -8
echo "=== forward sweep $(date +%T)"
timeout ${TUNE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" \
  --shapes ${TUNE_SHAPES:-wide-d512-fp16,ctr-mix-fp16,L20-D128-zipf,L20-D128-fp16,L100-D128,L20-B512} --budget ${TUNE_BUDGET:-30} 2>&1 \
  | grep -v "no entry for\|compatibility\|^ *$\|\[0m\|\[33m\|WARNING:root" | tee "$OUT/tune.log" | tail -6
echo "=== backward profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-100} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs ${CONFIGS:-ctr-mix,long-bags,b8192} --candidates default --iters 5 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|run_backward" | tee -a "$OUT/run.log" | tail -6
echo "=== done $(date +%T)"
