#!/usr/bin/env bash
# One device call (~6 minutes): RunsLaunch.plan_in_forward on the GPU. Its GPU test (and the
# plan's refactor through the backward's pieces and graphs tests), then the end-to-end DLRM
# benchmark under the four pipelines (plan in the forward, the default), then SparseDist with
# the plan in the backward (candidate plan_in_backward): the A/B of the side stream, both
# backends in each run. Results under $OUT: device.txt, gpu_tests.log, e2e.{json,md},
# e2e_plan_in_backward/e2e.{json,md}.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_plan.sh
source "$(dirname "$0")/device_common.sh" "plan in the forward"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/ops/test_plan_in_forward.py tests/ops/test_backward_pieces.py tests/ops/test_backward_graphs.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -6
filter() { grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT"; }
echo "=== e2e $(date +%T)"
timeout ${E2E_TIMEOUT:-170} python3 -m pipelines.bench.e2e --out "$OUT" --pipelines sparsedist,stale1,semisync,stale0 \
  2>&1 | filter | tail -14
echo "=== e2e, plan in the backward $(date +%T)"
timeout ${AB_TIMEOUT:-90} python3 -m pipelines.bench.e2e --out "$OUT/e2e_plan_in_backward" --pipelines ${AB_PIPELINES:-sparsedist} \
  --backward-launch plan_in_backward 2>&1 | filter | tail -8
echo "=== done $(date +%T)"
