#!/usr/bin/env bash
# One device call (~5 minutes): the candidate RunsLaunch.piece_repeats. Its GPU test; the
# backward's kernel profile with and without it (ctr-dlrm, long-bags, ctr-mix, user-id,
# FBGEMM's beside); the end to end under SparseDist and staleness 1 with it; the kernel suite
# with it (our modules under the candidate, FBGEMM's untouched). Results under $OUT:
# device.txt, gpu_tests.log, profile_backward.json, e2e_repeats/e2e.{json,md},
# suite_repeats/backward.{json,md}.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_repeats.sh
source "$(dirname "$0")/device_common.sh" "candidate piece_repeats"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-100} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_backward_pieces.py \
  -k repeats 2>&1 | tee "$OUT/gpu_tests.log" | tail -4
echo "=== profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-150} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs ${CONFIGS:-ctr-dlrm,long-bags,ctr-mix,user-id} --candidates default,repeats 2>&1 \
  | grep -v "no entry for\|compatibility\|WARNING" | tail -10
filter() { grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT"; }
echo "=== e2e with repeats $(date +%T)"
timeout ${E2E_TIMEOUT:-90} python3 -m pipelines.bench.e2e --out "$OUT/e2e_repeats" --pipelines sparsedist,stale1 \
  --backward-launch repeats 2>&1 | filter | grep "^| sparsedist\|^| stale1\|^| TBE\|^| dense" | tail -10
echo "=== suite with repeats $(date +%T)"
timeout ${SUITE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.profile_backward --suite-with repeats -- \
  --out "$OUT/suite_repeats" --iters 5 --warmup 2 --batches 2 --min-timed-ms 30 --max-iters 30 2>&1 \
  | grep "| bwd |\|geomean" | tail -30
echo "=== done $(date +%T)"
