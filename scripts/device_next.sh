#!/usr/bin/env bash
# One device call (~8 minutes) that times what 2026-12-03's sixth session built untimed:
# the pieces kernel's piece_lanes and piece_fit (profile_backward candidates against the
# default and FBGEMM, each candidate's kernels profiled) and FLAT 4 with per-sample weights
# (tune_forward --weighted against the lockstep tile the module takes for them) and on bf16
# rows (against bf16's own lockstep tile); first the GPU tests that check their bits.
# Results under $OUT: device.txt, gpu_tests.log, profile_backward.json, run.log,
# tune_forward.json, bf16/tune_forward.json.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_next.sh
# CANDIDATES and CONFIGS (comma-separated) override the defaults below; the profile's JSON
# is rewritten after each config, so a run cut by its limit keeps what it measured.
source "$(dirname "$0")/device_common.sh" "pieces lanes/fit, weighted FLAT 4"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_backward_pieces.py \
  tests/ops/test_forward_warp.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
echo "=== forward, per-sample weights $(date +%T)"
timeout ${TUNE_TIMEOUT:-60} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" --weighted \
  --shapes L20-D128-fp32,L20-D128-zipf,L10-D128-fp32 --budget 4 \
  --first "1,8,128,1,1,0,4;1,32,128,1,1,0,4;1,8,128,1,1,0,3" 2>&1 | grep " ms " | tee -a "$OUT/run.log"
echo "=== forward, bf16 rows $(date +%T)"
timeout ${BF16_TIMEOUT:-40} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT/bf16" --shapes L20-D128-bf16 \
  --budget 4 --first "1,8,128,1,1,0,4;1,32,128,1,1,0,4" 2>&1 | grep " ms " | tee -a "$OUT/run.log"
echo "=== backward candidates $(date +%T)"
CANDIDATES=${CANDIDATES:-default,lanes32_w1_fit,fit,w1_p32,lanes32_fit,unroll8_fit}
CONFIGS=${CONFIGS:-ctr-dlrm,b8192,ctr-mix,b65536,ctr-mix-fp16,long-bags,wide-d512-fp16}
timeout ${PROFILE_TIMEOUT:-330} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" --configs "$CONFIGS" \
  --candidates "$CANDIDATES" --iters 5 2>&1 | grep -v "no entry for\|compatibility" | tee -a "$OUT/run.log" | tail -40
echo "=== done $(date +%T)"
