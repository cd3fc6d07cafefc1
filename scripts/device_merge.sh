#!/usr/bin/env bash
# The candidates of 2026-12-05c (RunsLaunch.lean_operands, piece_evict; hot_rows with hot_split, hot_tf32x3),
# in two device calls of under 10 minutes: PARTS="tests profile" (~6 min: their GPU tests and the
# plan-in-forward, marks and pieces ones; the backward's kernel profile of $CANDIDATES on
# ctr-dlrm, long-bags and ctr-mix, FBGEMM's beside), then PARTS="e2e suite" (~5 min: the end to
# end under SparseDist and staleness 1 with $CANDIDATE and with the default, then the kernel
# suite with $CANDIDATE; $CANDIDATE is the profile's best on the same warm machine, else lean;
# E2E_CANDIDATES="a b": the end to end with each, in one process beside FBGEMM and the default).
# Results under $OUT: device.txt, gpu_tests.log, profile_backward.json, best_candidate.txt, e2e/e2e.{json,md},
# suite_$CANDIDATE/backward.{json,md}.
#   TBE_PLUGIN_COMMIT=<sha> TBE_PLUGIN_DIRTY=<0|1> PARTS="tests profile" bash scripts/device_merge.sh
source "$(dirname "$0")/device_common.sh" "plan candidates"
PARTS=${PARTS:-tests profile e2e suite}
# The best of the profile (profile_backward --best-of: FBGEMM's ms over ours, geomean over its
# configs, among candidates within 1e-3 of the default's results and nowhere more than 2% slower
# than it), kept on the warm machine for the next call; read again after this call's profile.
BEST=/tmp/tbe_best_candidate
best() { local c; c=$(cat "$BEST" 2>/dev/null); echo "${c:-lean}"; }
CHOSEN=${CANDIDATE:-}
CANDIDATE=${CHOSEN:-$(best)}
CANDIDATES=${CANDIDATES:-default,lean,evict,hot16_split_s1024,stack16,stack64_tf32}
part() { [[ " $PARTS " == *" $1 "* ]]; }
if part tests; then
  echo "=== gpu tests $(date +%T)"
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests/ops/test_merge_repeats.py \
    tests/ops/test_plan_in_forward.py tests/ops/test_marks_in_operands.py tests/ops/test_backward_pieces.py \
    tests/ops/test_lean_operands.py tests/ops/test_hot_split.py tests/ops/test_hot_rows.py \
    tests/ops/test_hot_product.py \
    2>&1 | tee "$OUT/gpu_tests.log" | tail -4
fi
if part profile; then
  echo "=== profile $(date +%T)"
  timeout ${PROFILE_TIMEOUT:-400} python3 -m tbe_plugin.benchmarks.profile_backward --out "$OUT" \
    --configs ${CONFIGS:-ctr-dlrm,long-bags,ctr-mix} --candidates "$CANDIDATES" 2>&1 \
    | grep -v "no entry for\|compatibility\|WARNING" | tail -12
  # Written only when the ranking succeeds (a failed one leaves the last good pick or none).
  python3 -m tbe_plugin.benchmarks.profile_backward --best-of "$OUT/profile_backward.json" > "$BEST.new" \
    && [ -s "$BEST.new" ] && mv "$BEST.new" "$BEST" && echo "best: $(cat "$BEST")" | tee "$OUT/best_candidate.txt"
  rm -f "$BEST.new"
  CANDIDATE=${CHOSEN:-$(best)}
fi
filter() { grep -v "Warning\|warn(\|WARNING\|DistributedDataParallel(\|is_fx_tracing\|HeuristicalStorage\|table, width\|USDT"; }
if part e2e; then
  # One process: FBGEMM, our default and triton@<candidate> for each of the list (the pick when
  # none is given), every pipeline's runs back to back on the same batches.
  backends=fbgemm,triton
  for c in ${E2E_CANDIDATES:-$CANDIDATE}; do [ "$c" = default ] || backends="$backends,triton@$c"; done
  echo "=== e2e $backends $(date +%T)"
  timeout ${E2E_TIMEOUT:-200} python3 -m pipelines.bench.e2e --out "$OUT/e2e" \
    --pipelines ${E2E_PIPELINES:-sparsedist,stale1} --backends "$backends" 2>&1 | filter \
    | grep "^| sparsedist\|^| stale1\|^| TBE\|^| dense\|^| group" | tail -16
fi
if part suite; then
  echo "=== suite with $CANDIDATE $(date +%T)"
  timeout ${SUITE_TIMEOUT:-180} python3 -m tbe_plugin.benchmarks.profile_backward --suite-with "$CANDIDATE" \
    -- --out "$OUT/suite_$CANDIDATE" --iters 5 --warmup 2 --batches 2 --min-timed-ms 30 --max-iters 30 2>&1 \
    | grep "| bwd |\|geomean" | tail -30
fi
echo "=== done $(date +%T)"
