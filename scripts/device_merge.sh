#!/usr/bin/env bash
# One device call (~6 minutes): the candidate RunsLaunch.merge_repeats (a bag's repeats of a
# row merged before the sort). Its GPU tests and the sm_90 compile check of its kernels; the
# backward's kernel profile with windows of 32 and 64 (ctr-dlrm, long-bags, ctr-mix, user-id,
# FBGEMM's beside); the end to end under SparseDist and staleness 1 with windows of 32; the
# kernel suite with them. Results under $OUT: device.txt, gpu_tests.log, profile_backward.json,
# e2e_merge32/e2e.{json,md}, suite_merge32/backward.{json,md}.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_merge.sh
source "$(dirname "$0")/device_common.sh" "candidate merge_repeats"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_merge_repeats.py \
  tests/ops/test_plan_in_forward.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
echo "=== profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs ${CONFIGS:-ctr-dlrm,long-bags,ctr-mix,user-id} --candidates default,merge32,merge64 2>&1 \
  | grep -v "no entry for\|compatibility\|WARNING" | tail -10
filter() { grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT"; }
echo "=== e2e with merge32 $(date +%T)"
timeout ${E2E_TIMEOUT:-90} python3 -m pipelines.bench.e2e --out "$OUT/e2e_merge32" --pipelines sparsedist,stale1 \
  --backward-launch ${E2E_CANDIDATE:-merge32} 2>&1 | filter | grep "^| sparsedist\|^| stale1\|^| TBE\|^| dense" | tail -10
echo "=== suite with merge32 $(date +%T)"
timeout ${SUITE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.profile_backward --suite-with ${SUITE_CANDIDATE:-merge32} \
  -- --out "$OUT/suite_merge32" --iters 5 --warmup 2 --batches 2 --min-timed-ms 30 --max-iters 30 2>&1 \
  | grep "| bwd |\|geomean" | tail -30
echo "=== done $(date +%T)"
