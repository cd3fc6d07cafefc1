#!/usr/bin/env bash
# One device call (~6 minutes) that measures HEAD's defaults: the GPU tests of the forward,
# the backward's CUDA graphs and pieces; the kernel suite (forward and backward against
# FBGEMM, 5 timed rounds, up to 30 for short calls); the end-to-end DLRM benchmark under the
# four pipelines; what drawing
# the app's planted click log costs; a short forward sweep on the end-to-end tables (TUNE=0
# skips it). Results under $OUT (the device returns at most 8 files): device.txt,
# gpu_tests.log, backward.json, backward.md, e2e.json, e2e.md, planted.json, planted.md
# (tune_forward.json in place of planted.* when TUNE=1 and PLANTED=0), small/backward.{json,md}
# (SMALL=1: fbgemm-standard and user-id again with 30 rounds; 10 files then: set PLANTED=0).
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_head.sh
source "$(dirname "$0")/device_common.sh" "HEAD's defaults"
echo "=== gpu tests $(date +%T)"
# (FBGEMM's parity file is left to the full GPU run: with it this subset outran 150 s at 1adc462.)
[ "${TESTS:-1}" = 0 ] || timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rs \
  tests/pipelines/test_data.py tests/ops/test_backward_graphs.py tests/ops/test_embedding_forward.py \
  tests/ops/test_forward_flat.py tests/ops/test_forward_warp.py tests/ops/test_backward_pieces.py 2>&1 \
  | tee "$OUT/gpu_tests.log" | tail -8
echo "=== suite $(date +%T)"
# 5 rounds, more for calls under ~6 ms (rounds x a warm-up call >= 30 ms, at most 30 rounds):
# the host-bound small configs' medians otherwise sit inside their call-to-call spread.
timeout ${SUITE_TIMEOUT:-170} python3 -m tbe_plugin.benchmarks.backward --out "$OUT" --iters 5 --warmup 2 --batches 2 \
  --min-timed-ms ${MIN_TIMED_MS:-30} --max-iters 30 2>&1 \
  | grep -v "no entry for\|compatibility\|^ *$\|\[0m\|\[33m\|WARNING:root" | tail -30
if [ "${SMALL:-0}" != 0 ]; then
  # The host-bound configs again with 30 rounds: 5 leave their medians inside run-to-run noise.
  echo "=== small configs, 30 rounds $(date +%T)"
  timeout ${SMALL_TIMEOUT:-90} python3 -m tbe_plugin.benchmarks.backward --out "$OUT/small" --configs fbgemm-standard,user-id \
    --iters 30 --warmup 3 --batches 2 2>&1 | grep "| bwd |" | tail -4
fi
echo "=== e2e $(date +%T)"
timeout ${E2E_TIMEOUT:-150} python3 -m pipelines.bench.e2e --out "$OUT" --pipelines sparsedist,stale1,semisync,stale0 2>&1 \
  | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT" \
  | tail -14
if [ "${PLANTED:-1}" != 0 ]; then
  echo "=== planted click log $(date +%T)"
  timeout ${PLANTED_TIMEOUT:-90} python3 -m pipelines.bench.planted --out "$OUT" 2>&1 | tail -7
fi
if [ "${TUNE:-1}" != 0 ]; then
  echo "=== forward sweep $(date +%T)"
  timeout ${TUNE_TIMEOUT:-60} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" --shapes ctr-dlrm \
    --budget ${TUNE_BUDGET:-24} 2>&1 | grep "ms" | tail -3
fi
echo "=== done $(date +%T)"
