# scripts/bench, section redis: scripts/bench-redis (the Redis store's scripts against a naive
# script and raw EVALSHA inside Redis, then the client), its tables under this section.

section_redis() {
  echo "### Redis store: scripts inside Redis, and the client"
  echo
  local args
  if [ "$QUICK" = 1 ]; then
    args=(--requests 20000 --client-requests 20000 --rounds "$REPS" --algorithms "token_bucket gcra")
  else
    args=(--requests 50000 --client-requests 100000 --rounds "$REPS")
  fi
  scripts/bench-redis "${args[@]}" | sed -e 's/^## Redis store/#### scripts\/bench-redis/' >"$OUT/redis.md"
  cat "$OUT/redis.md"
  emit_table_rows redis "$OUT/redis.md"
}
