#!/usr/bin/env bash
# One device call (~5 minutes) that times what 2026-12-03's seventh session built untimed:
# the pieces kernel's short runs in a launch of their own (RunsLaunch.piece_short: 1-64 ids,
# with and without piece_fit, the other pieces on one-warp programs) against the default,
# lanes32_w1_fit and FBGEMM (profile_backward, each candidate's kernels profiled); first the
# GPU tests that check their bits and those of the forward's warp kernel (FLAT 4 now the
# default for per-sample weights and bf16 rows).
# Results under $OUT: device.txt, gpu_tests.log, profile_backward.json, run.log.
# After the GPU stack's first call (../shared/device/README.md), with the carry of part b:
#   bash .gpu-stack/install.sh b && TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> bash scripts/device_next.sh
# CANDIDATES and CONFIGS (comma-separated) override the defaults below; the profile's JSON
# is rewritten after each config, so a run cut by its limit keeps what it measured.
source "$(dirname "$0")/device_common.sh" "pieces short runs apart"
echo "=== gpu tests $(date +%T)"
timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_backward_pieces.py \
  tests/ops/test_forward_warp.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -6
echo "=== backward candidates $(date +%T)"
CANDIDATES=${CANDIDATES:-default,short4,short8,short16,short32,short8_w1_p32,short16_w1_p32,short16_fit,short16_tile512}
CONFIGS=${CONFIGS:-ctr-dlrm,b8192,ctr-mix,b65536,ctr-mix-fp16,long-bags,wide-d512-fp16}
timeout ${PROFILE_TIMEOUT:-360} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" --configs "$CONFIGS" \
  --candidates "$CANDIDATES" --iters 5 2>&1 | grep -v "no entry for\|compatibility\|UserWarning\|run_backward" \
  | tee -a "$OUT/run.log" | tail -70
echo "=== done $(date +%T)"
