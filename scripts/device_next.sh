#!/usr/bin/env bash
# One device call (~5 minutes) that measures HEAD's defaults after 2026-12-03's seventh
# session made RunsLaunch.piece_short (16) the default: a short profile of the backward's
# kernels with it on and off (profile_backward: default, noshort, short8, short32 on three
# configs), then the kernel suite and the end-to-end benchmark (scripts/device_head.sh with
# TESTS=0 PLANTED=0 TUNE=0). The GPU tests run in a call of their own.
# Results under $OUT: device.txt, profile_backward.json, backward.{json,md}, e2e.{json,md}.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_next.sh
source "$(dirname "$0")/device_common.sh" "pieces short runs apart by default"
echo "=== backward candidates $(date +%T)"
CANDIDATES=${CANDIDATES:-default,noshort,short8,short32}
CONFIGS=${CONFIGS:-ctr-dlrm,b8192,wide-d512-fp16}
timeout ${PROFILE_TIMEOUT:-90} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" --configs "$CONFIGS" \
  --candidates "$CANDIDATES" --iters 5 2>&1 | grep -v "no entry for\|compatibility\|UserWarning\|run_backward" \
  | tee -a "$OUT/run.log" | tail -14
TESTS=0 PLANTED=0 TUNE=0 bash "$(dirname "$0")/device_head.sh"
