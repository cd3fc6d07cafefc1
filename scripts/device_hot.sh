#!/usr/bin/env bash
# One device call (~3 minutes): RunsLaunch.hot_rows (each table's hottest rows summed apart)
# against the default: its GPU tests, profile_backward on the skewed configs (default, hot16,
# hot64), and the end to end under SparseDist and staleness 1 with hot16. Results under $OUT:
# device.txt, gpu_tests.log, profile_backward.json, e2e.{json,md}.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_hot.sh
source "$(dirname "$0")/device_common.sh" "hot rows apart"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-60} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_hot_rows.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -3
echo "=== profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-90} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs "${CONFIGS:-ctr-dlrm,ctr-mix,long-bags}" --candidates default,hot16,hot64 --iters 5 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|run_backward\|warn" | tail -12
echo "=== e2e $(date +%T)"
timeout ${E2E_TIMEOUT:-80} python3 -m pipelines.bench.e2e --out "$OUT" --backward-launch hot16 \
  --pipelines sparsedist,stale1 2>&1 | grep "^| sparsedist\|^| stale1\|^| TBE\|^| dense" | head -12
echo "=== done $(date +%T)"
