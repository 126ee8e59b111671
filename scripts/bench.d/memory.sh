# scripts/bench, section memory: the memory store against governor's keyed limiter.

# The memory store vs governor: the criterion bench `vs_governor` (criterion medians, then the
# paired rounds) and the example `bytes_per_key`, both run --reps times from the binaries built
# up front (what scripts/bench-memory runs once through cargo).
section_memory() {
  local crit=(--warm-up-time 0.3 --measurement-time 1)
  if [ "$QUICK" = 1 ]; then crit=(--warm-up-time 0.2 --measurement-time 0.5); fi
  [ -n "$VS_GOVERNOR" ] && [ -x "$VS_GOVERNOR" ] || { echo "vs_governor bench binary not found" >&2; return 1; }
  local rep
  for rep in $(seq 1 "$REPS"); do
    log "memory rep $rep/$REPS"
    rm -rf "$OUT/criterion-$rep"
    CRITERION_HOME="$OUT/criterion-$rep" "$VS_GOVERNOR" --bench "${crit[@]}" \
      >"$OUT/memory-$rep.txt" 2>"$OUT/logs/memory-criterion-$rep.log"
    "$EX/bytes_per_key" >"$OUT/memory-bytes-$rep.txt"
  done
  echo "### Memory store vs governor (keyed)"
  echo
  echo "The criterion bench \`vs_governor\` (\`--bench ${crit[*]}\`, 20 samples per benchmark) followed"
  echo "by its paired rounds, then the example \`bytes_per_key\`, run $REPS times; each cell is min / median /"
  echo "max over the $REPS runs (ratios taken within a run). Ratios below 1 mean tollgate is faster or smaller."
  echo
  python3 "$BENCH_D/memory_report.py" "$OUT" "$REPS" "$RESULTS"
}
