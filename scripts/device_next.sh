#!/usr/bin/env bash
# One device call (~8 minutes) for the next session: RunsLaunch.hot_rows (each table's
# hottest rows summed apart as counts times the output gradient; built at 8fc26f9, CPU-tested,
# never run on the GPU). First its GPU tests (scripts/device_hot.sh: tests, profile of
# default/hot16/hot64 on ctr-dlrm, ctr-mix, long-bags, the end to end under SparseDist and
# staleness 1 with hot16), then the backward suite under the profile's best candidate.
# Results under $OUT: device.txt, gpu_tests.log, profile_backward.json, e2e.{json,md},
# suite/backward.{json,md}, suite/suite_launch.json.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_next.sh
source "$(dirname "$0")/device_common.sh" "hot rows apart, then the suite under the best"
OUT=$OUT bash "$(dirname "$0")/device_hot.sh"
best=$(python3 -m tbe_plugin.benchmarks.profile_backward --best-of "$OUT/profile_backward.json" 2>/dev/null | tail -1)
echo "=== suite under ${best:-default} $(date +%T)"
timeout ${SUITE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.profile_backward --suite-with "${best:-default}" -- \
  --out "$OUT/suite" --iters 5 --warmup 2 --batches 2 --min-timed-ms 30 --max-iters 30 2>&1 \
  | grep "geomean\|| bwd |" | tail -30
echo "=== done $(date +%T)"
