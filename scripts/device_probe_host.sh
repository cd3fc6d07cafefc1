#!/usr/bin/env bash
# One device call (~3 minutes): the hot rows' GPU tests (eager: graph_max_ids=0) and their
# profile on ctr-dlrm after the host sync and the running minimum came out of their path,
# then where a small batch's backward host time goes (benchmarks/probe_graph_launch: graph
# replay cost by node count; ours and FBGEMM's backward host and wall time on user-id and
# FBGEMM's standard). Results under $OUT: device.txt, gpu_tests.log, profile_backward.json,
# probe_graph_launch.json.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_probe_host.sh
source "$(dirname "$0")/device_common.sh" "hot rows fixed; host probe"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-90} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_hot_rows.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -3
echo "=== profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-90} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs "${CONFIGS:-ctr-dlrm,long-bags}" --candidates default,hot16,hot64 --iters 5 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|run_backward\|warn" | tail -8
echo "=== host probe $(date +%T)"
timeout ${PROBE_TIMEOUT:-120} python3 -m tbe_plugin.benchmarks.probe_graph_launch --out "$OUT" 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|warn" | tail -5
echo "=== done $(date +%T)"
