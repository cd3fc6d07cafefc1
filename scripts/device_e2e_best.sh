#!/usr/bin/env bash
# The end-to-end benchmark (pipelines.bench.e2e: TorchRec DLRM over the CTR tables, both
# backends, the four pipelines) with triton's backward under the candidate launch that
# scripts/device_bwd_next.sh found best on the same warm machine (/tmp/tbe_best_candidate),
# or under $CANDIDATE. Results: $OUT/e2e.json, e2e.md, e2e.log, device.txt.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_e2e_best.sh
set -uo pipefail
export PYTHONPATH=/tmp/gpu-site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
: "${TBE_PLUGIN_COMMIT:?set TBE_PLUGIN_COMMIT (and TBE_PLUGIN_DIRTY) from the checkout that was sent}"
export TBE_PLUGIN_COMMIT TBE_PLUGIN_DIRTY=${TBE_PLUGIN_DIRTY:-}
CANDIDATE=${CANDIDATE:-$(cat /tmp/tbe_best_candidate 2>/dev/null || echo default)}
[ "$CANDIDATE" = default ] && CANDIDATE=""
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  echo "commit $TBE_PLUGIN_COMMIT dirty ${TBE_PLUGIN_DIRTY:-unknown} backward launch ${CANDIDATE:-default}"; } | tee "$OUT/device.txt"
timeout ${E2E_TIMEOUT:-540} python3 -m pipelines.bench.e2e --out "$OUT" --backward-launch "$CANDIDATE" ${E2E_ARGS:-} 2>&1 \
  | grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT" \
  | tee "$OUT/e2e.log" | tail -60
