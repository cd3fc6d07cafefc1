#!/usr/bin/env bash
# The end-to-end benchmark (pipelines.bench.e2e: TorchRec DLRM over the CTR tables, both
# backends, the four pipelines) with triton's backward under the candidate launch that
# scripts/device_bwd_next.sh found best on the same warm machine (/tmp/tbe_best_candidate),
# or under $CANDIDATE; then the forward's launch sweep on production-shaped tables (TUNE=0
# skips it). Results: $OUT/e2e.json, e2e.md, e2e.log, tune_forward.json, tune.log, device.txt.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_e2e_best.sh
CANDIDATE=${CANDIDATE:-$(cat /tmp/tbe_best_candidate 2>/dev/null || echo default)}
[ "$CANDIDATE" = default ] && CANDIDATE=""
source "$(dirname "$0")/device_common.sh" "backward launch ${CANDIDATE:-default}"
echo "=== e2e $(date +%T)"
timeout ${E2E_TIMEOUT:-240} python3 -m pipelines.bench.e2e --out "$OUT" --backward-launch "$CANDIDATE" \
  --pipelines ${E2E_PIPELINES:-sparsedist,stale1,semisync,stale0} ${E2E_ARGS:-} 2>&1 \
  | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT" \
  | tee "$OUT/e2e.log" | tail -30
if [ "${TUNE:-1}" != 0 ]; then
  echo "=== forward sweep $(date +%T)"
  timeout ${TUNE_TIMEOUT:-330} python3 -m tbe_plugin.benchmarks.tune_forward --out "$OUT" \
    --shapes ${TUNE_SHAPES:-ctr-dlrm,long-bags} --budget ${TUNE_BUDGET:-88} 2>&1 | tee "$OUT/tune.log" | tail -10
fi
echo "=== done $(date +%T)"
