# scripts/bench, section abuse: the example abuse_bench, 5% of clients at 50x their limit,
# the deny cache on and off.

section_abuse() {
  local args=()
  if [ "$QUICK" = 1 ]; then args=(--seconds 3 --reps "$REPS" --users 1000)
  else args=(--seconds 6 --reps "$REPS" --users 2000); fi
  "$EX/abuse_bench" "${args[@]}" >"$OUT/abuse.txt"
  emit_json_lines abuse "$OUT/abuse.txt"
  echo "### Abuse: 5% of clients at 50x their limit, deny cache on vs off"
  echo
  echo "\`abuse_bench ${args[*]}\`:"
  echo
  grep -v '^{' "$OUT/abuse.txt" | sed '/./,$!d'
}
