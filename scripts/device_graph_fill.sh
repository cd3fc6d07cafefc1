#!/usr/bin/env bash
# One device call (~3 minutes) that times the graph_fill candidate (RunsLaunch.graph_fill, off
# by default): the GPU tests of the captured graphs (filled-adam-fp16 among them); the host
# profile of FBGEMM's standard B=512 and user-id (the two host-bound configs below 1.0x) under
# the default launch and graphs_fill; profile_backward's device time and wall time of both
# configs under both launches against FBGEMM's. Results under $OUT: device.txt,
# gpu_tests.log, host_profile.json, host_profile.txt, profile_backward.json.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_graph_fill.sh
source "$(dirname "$0")/device_common.sh" "graph_fill candidate"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-90} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_backward_graphs.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -4
echo "=== host profile $(date +%T)"
timeout ${HOST_TIMEOUT:-90} python3 -m tbe_plugin.benchmarks.host_profile --out "$OUT" --workloads standard,user-id \
  --candidates default,graphs_fill --calls 30 2>&1 | grep "backward wall" | tail -4
echo "=== backward profile $(date +%T)"
timeout ${PROFILE_TIMEOUT:-120} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
  --configs fbgemm-standard,user-id --candidates default,graphs_fill --iters 20 2>&1 \
  | grep -v "no entry for\|compatibility\|UserWarning\|run_backward" | tail -8
echo "=== done $(date +%T)"
