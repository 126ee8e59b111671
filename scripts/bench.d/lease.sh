# scripts/bench, section lease: the example lease_bench, exact vs leased decisions with 20
# limiters on one Redis.

section_lease() {
  local args=()
  if [ "$QUICK" = 1 ]; then args=(--seconds 3 --reps "$REPS" --limit 2000 --users 100 --user-rate 1000)
  else args=(--seconds 6 --reps "$REPS"); fi
  "$EX/lease_bench" "${args[@]}" >"$OUT/lease.txt"
  emit_json_lines lease "$OUT/lease.txt"
  echo "### Leases vs exact (20 limiters on one Redis)"
  echo
  echo "\`lease_bench ${args[*]}\`:"
  echo
  grep -v '^{' "$OUT/lease.txt" | sed '/./,$!d'
}
