#!/usr/bin/env bash
# One device call (~8 minutes) for the next session: HEAD's short launch as changed after
# 0020964 was measured (row start and D re-aligned after the lanes' gather: 16-byte row
# stores, ADAM's variant 83 -> 64 registers; its grid fitted to the resident programs; off
# for two-state optimizers and tiles wider than 256). First the pieces GPU tests; then the
# profile (default, noshort, short_two, short_nofit) on the configs that moved, the
# two-state optimizers on uniform b8192 included; then the suite and the end to end
# (device_head.sh, TESTS=0 PLANTED=0 TUNE=0). Results under $OUT: device.txt, gpu_tests.log,
# profile_backward.json, run.log, backward.{json,md}, e2e.{json,md}.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_next.sh
source "$(dirname "$0")/device_common.sh" "short launch re-aligned and fitted"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-90} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_backward_pieces.py \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -4
echo "=== backward candidates $(date +%T)"
timeout ${PROFILE_TIMEOUT:-120} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs "${CONFIGS:-b8192,ctr-dlrm,ctr-mix,wide-d512-fp16}" --optimizers EXACT_ROWWISE_ADAGRAD,ADAM,LAMB \
  --candidates "${CANDIDATES:-default,noshort,short_two,short_two_w2,short_nofit}" --iters 5 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|run_backward" | tee -a "$OUT/run.log" | tail -40
TESTS=0 PLANTED=0 TUNE=0 bash "$(dirname "$0")/device_head.sh"
