# scripts/bench, section gateway: first the CPU each gateway spends per request, pinned alone
# to one core, tollgate (decision and proxy mode, memory and Redis store) against nginx
# limit_req in the same mode (gateway_cpu.py); then wrk through `tollgate serve` in proxy mode
# (memory and Redis stores) against the upstream called directly and nginx limit_req,
# interleaved per repetition. Draws docs/bench/gateway.svg.

WRK_LUA=""
write_wrk_lua() {
  WRK_LUA="$OUT/keys.lua"
  cat >"$WRK_LUA" <<'LUA'
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/", { ["x-api-key"] = "key-" .. math.random(1, 100000) })
end
LUA
}

wrk_run() { # name, url, rep, duration, connections -> sets W_RPS W_P50 W_P99 (ms) W_NON2XX
  local name=$1 url=$2 rep=$3 dur=$4 conns=$5 f="$OUT/wrk-$1-$3.txt"
  wrk -t2 -c"$conns" -d"$dur" --latency -s "$WRK_LUA" "$url" >"$f"
  W_RPS=$(awk '/Requests\/sec/ { print $2 }' "$f")
  W_P50=$(awk '$1 == "50%" { print $2 }' "$f" | to_ms)
  W_P99=$(awk '$1 == "99%" { print $2 }' "$f" | to_ms)
  W_NON2XX=$(awk '/Non-2xx/ { print $NF }' "$f"); W_NON2XX=${W_NON2XX:-0}
  emit gateway "\"run\":\"$name\",\"rep\":$rep,\"requests_per_s\":$W_RPS,\"p50_ms\":$W_P50,\"p99_ms\":$W_P99,\"non_2xx\":$W_NON2XX" >/dev/null
}
to_ms() { awk '{ v = $1; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } printf "%.3f\n", v }'; }

# The table of issue 16: CPU microseconds per request of each gateway on one core.
gateway_cpu_table() { # duration
  echo "### Gateway: CPU per request, each gateway alone on one core"
  echo
  if [ "$(nproc)" -lt 2 ]; then
    echo "Not measured: this needs two CPUs (one for the gateway, one for wrk and the upstream)."
    echo
    return 0
  fi
  echo "Each gateway pinned alone to CPU 1 (taskset); wrk (1 thread, 64 connections), the upstream"
  echo "(an nginx answering 200) and redis-server share CPU 0. Every request carries one of 100,000"
  echo "random API keys, limit 100/min per key (tollgate: token_bucket; nginx: \`limit_req"
  echo "rate=100r/m burst=100 nodelay\`), so almost every request is allowed and is one store call."
  echo "Decision mode answers 200 itself (nginx: \`return 200\`); proxy mode forwards to the upstream"
  echo "(nginx: \`proxy_pass\` with upstream keepalive). CPU per request is the gateway's utime +"
  echo "stime during the wrk run divided by the requests completed. Median of $REPS interleaved"
  echo "repetitions; the ratio is to nginx in the same mode and repetition. \"http floor\" is the"
  echo "example \`http_floor\`: the gateway's HTTP server and runtime answering the same 200 with no"
  echo "limiter, the floor under decision mode."
  echo "\`scripts/bench.d/gateway_cpu.py --tollgate target/release/tollgate --floor"
  echo "target/release/examples/http_floor --reps $REPS --duration $1\`."
  echo
  python3 "$BENCH_D/gateway_cpu.py" --tollgate "tollgate=$BIN" --floor "http floor=$EX/http_floor" \
    --reps "$REPS" --duration "$1" \
    --json "$RESULTS" 2>>"$OUT/logs/gateway-cpu.log"
  echo
}

section_gateway() {
  local dur=6s conns=64
  if [ "$QUICK" = 1 ]; then dur=3s; fi
  gateway_cpu_table "$dur"
  write_wrk_lua
  local up nl
  up=$(free_port); nl=$(free_port)
  # The upstream: nginx answering 200 itself. The nginx limiter: limit_req keyed on the same
  # header, 100/min with a burst of 100 (like token_bucket 100/min), local to its process.
  start_nginx upstream "  server { listen 127.0.0.1:$up; location / { return 200 \"ok\\n\"; } }"
  start_nginx limit "  limit_req_zone \$http_x_api_key zone=api:32m rate=100r/m;
  upstream up { server 127.0.0.1:$up; keepalive 64; }
  server { listen 127.0.0.1:$nl;
    location / { limit_req zone=api burst=100 nodelay; limit_req_status 429;
      proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
  wait_http "http://127.0.0.1:$up/"
  wait_http "http://127.0.0.1:$nl/"
  start_redis "$OUT/gateway-redis"
  local mp ma rp ra
  mp=$(free_port); ma=$(free_port); rp=$(free_port); ra=$(free_port)
  serve_config "$OUT/gw-memory.toml" "$mp" "$ma" "http://127.0.0.1:$up" $'[store]\nbackend = "memory"'
  serve_config "$OUT/gw-redis.toml" "$rp" "$ra" "http://127.0.0.1:$up" \
    "$(printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "200ms"' "$REDIS_PORT")"
  TOLLGATE_LOG=warn "$BIN" serve --config "$OUT/gw-memory.toml" >"$OUT/logs/gw-memory.log" 2>&1 &
  SECTION_PIDS+=("$!")
  TOLLGATE_LOG=warn "$BIN" serve --config "$OUT/gw-redis.toml" >"$OUT/logs/gw-redis.log" 2>&1 &
  SECTION_PIDS+=("$!")
  wait_http "http://127.0.0.1:$ma/healthz"
  wait_http "http://127.0.0.1:$ra/healthz"

  declare -A RPS P50 P99 NON
  local names=(direct tollgate-memory tollgate-redis nginx-limit_req)
  declare -A URL=(
    [direct]="http://127.0.0.1:$up/" [tollgate-memory]="http://127.0.0.1:$mp/"
    [tollgate-redis]="http://127.0.0.1:$rp/" [nginx-limit_req]="http://127.0.0.1:$nl/")
  local rep n
  for rep in $(seq 1 "$REPS"); do
    for n in "${names[@]}"; do
      log "gateway rep $rep/$REPS: $n"
      wrk_run "$n" "${URL[$n]}" "$rep" "$dur" "$conns"
      RPS[$n]="${RPS[$n]:-} $W_RPS"; P50[$n]="${P50[$n]:-} $W_P50"; P99[$n]="${P99[$n]:-} $W_P99"
      NON[$n]="${NON[$n]:-} $W_NON2XX"
    done
  done
  echo "### Gateway: wrk through tollgate serve (proxy mode) vs nginx limit_req"
  echo
  echo "\`wrk -t2 -c$conns -d$dur --latency\` (keep-alive, fixed connections), every request with one of"
  echo "100,000 random API keys; limit 100/min per key (tollgate: token_bucket; nginx: \`limit_req"
  echo "rate=100r/m burst=100 nodelay\`). The upstream is an nginx answering 200 (1 worker); every"
  echo "limiter is a proxy in front of it. nginx's limit is local to its process: the difference"
  echo "between the last rows is the price of a limit shared through Redis. min / median / max of"
  echo "$REPS interleaved repetitions; ratios per repetition against the same repetition's row."
  echo
  echo "| path | requests/s | p50 ms | p99 ms | requests/s vs direct | requests/s vs nginx limit_req | non-2xx |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  for n in "${names[@]}"; do
    echo "| $n | $(stats ${RPS[$n]}) | $(stats ${P50[$n]}) | $(stats ${P99[$n]}) | $(stats $(ratios "${RPS[$n]}" "${RPS[direct]}")) | $(stats $(ratios "${RPS[$n]}" "${RPS[nginx-limit_req]}")) | $(median ${NON[$n]}) |"
  done
  echo
  # Drawn by tollgate's chart helper (crates/tollgate-bench/src/chart), like every chart.
  local bars=() v
  for n in "${names[@]}"; do v=$(median ${RPS[$n]}); bars+=("$n=${v:-0}"); done
  "$EX/bar_chart" "$ROOT/docs/bench/gateway.svg" "requests/s through each path (wrk, median)" \
    throughput req/s "${bars[@]}"
  echo "![requests/s per path](bench/gateway.svg)"
}
