# scripts/bench, section peers: tollgate's RedisStore, limitador and rate-limiter-flexible
# (benches/peers/) and raw pipelined EVALSHA on one redis-server, interleaved per repetition.

# 64 concurrent callers over 100,000 clients, 100/min per client.
section_peers() {
  local dur=6 n=200000 rb_n=200000
  if [ "$QUICK" = 1 ]; then dur=3; n=40000; rb_n=40000; fi
  start_redis "$OUT/peers-redis"
  local port=$REDIS_PORT url="redis://127.0.0.1:$REDIS_PORT"
  local sdir="$OUT/peers-scripts"; mkdir -p "$sdir"
  local sha
  sha=$("$REDIS_BENCH" --print-scripts "$sdir" | awk '$1 == "token_bucket" { print $2 }')
  redis-cli -h 127.0.0.1 -p "$port" -x script load <"$sdir/token_bucket.lua" >/dev/null
  # The single-policy script of a 100-per-minute token bucket (quota built in): its argument
  # is the cost (see crates/tollgate-redis/scripts/check_one.lua).
  local evargs=(1)

  # Built before the first section (see "build once"): LIM_BIN / LIM_ERR, RLF_OK / RLF_ERR.
  local lim_bin="$LIM_BIN" lim_err="$LIM_ERR" rlf_ok="$RLF_OK" rlf_err="$RLF_ERR"

  local fw="" fw50="" fw99="" raw="" ours="" ours50="" ours99="" lim="" lim50="" lim99="" rlf="" rlf50="" rlf99="" rep line
  for rep in $(seq 1 "$REPS"); do
    log "peers rep $rep/$REPS"
    redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
    line=$(redis-benchmark -h 127.0.0.1 -p "$port" -P 32 -c 64 -n "$rb_n" -r 100000 --csv \
      EVALSHA "$sha" 1 "tollgate:{__rand_int__}:token_bucket" "${evargs[@]}" | tail -n1)
    local v; v=$(cut -d, -f2 <<<"$line" | tr -d '"' | cut -d. -f1)
    case "$v" in ''|*[!0-9]*) echo "redis-benchmark EVALSHA failed: $line" >&2; return 1 ;; esac
    raw="$raw $v"; emit peers "\"peer\":\"redis-benchmark EVALSHA\",\"rep\":$rep,\"decisions_per_s\":$v"

    redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
    line=$("$REDIS_BENCH" --url "$url" --algorithm token_bucket --requests "$n" --callers 64 \
      --clients 100000 --connections 1 --threads 1)
    local d p50 p99
    d=$(sed 's/.*decisions_per_s=\([0-9]*\).*/\1/' <<<"$line")
    p50=$(sed 's/.*p50_us=\([0-9]*\).*/\1/' <<<"$line"); p99=$(sed 's/.*p99_us=\([0-9]*\).*/\1/' <<<"$line")
    ours="$ours $d"; ours50="$ours50 $p50"; ours99="$ours99 $p99"
    emit peers "\"peer\":\"tollgate RedisStore\",\"rep\":$rep,\"decisions_per_s\":$d,\"p50_us\":$p50,\"p99_us\":$p99"

    # tollgate with a fixed window: the algorithm both peers implement.
    redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
    line=$("$REDIS_BENCH" --url "$url" --algorithm fixed_window --requests "$n" --callers 64 \
      --clients 100000 --connections 1 --threads 1)
    d=$(sed 's/.*decisions_per_s=\([0-9]*\).*/\1/' <<<"$line")
    p50=$(sed 's/.*p50_us=\([0-9]*\).*/\1/' <<<"$line"); p99=$(sed 's/.*p99_us=\([0-9]*\).*/\1/' <<<"$line")
    fw="$fw $d"; fw50="$fw50 $p50"; fw99="$fw99 $p99"
    emit peers "\"peer\":\"tollgate RedisStore fixed_window\",\"rep\":$rep,\"decisions_per_s\":$d,\"p50_us\":$p50,\"p99_us\":$p99"

    if [ -n "$lim_bin" ]; then
      redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
      line=$("$lim_bin" --url "$url" --callers 64 --clients 100000 --seconds "$dur" | grep '^{' | tail -n1)
      lim="$lim $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decisions_per_s"])' "$line")"
      lim50="$lim50 $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["p50_us"])' "$line")"
      lim99="$lim99 $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["p99_us"])' "$line")"
      line=${line#\{}; emit peers "\"peer\":\"limitador\",\"rep\":$rep,${line%\}}"
    fi
    if [ "$rlf_ok" = 1 ]; then
      redis-cli -h 127.0.0.1 -p "$port" flushall >/dev/null
      line=$(node benches/peers/rate-limiter-flexible/bench.js --url "$url" --callers 64 \
        --clients 100000 --seconds "$dur" | grep '^{' | tail -n1)
      rlf="$rlf $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["decisions_per_s"])' "$line")"
      rlf50="$rlf50 $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["p50_us"])' "$line")"
      rlf99="$rlf99 $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["p99_us"])' "$line")"
      line=${line#\{}; emit peers "\"peer\":\"rate-limiter-flexible\",\"rep\":$rep,${line%\}}"
    fi
  done

  echo "### Redis store vs peers on the same redis-server"
  echo
  echo "One redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on loopback; 64 concurrent callers over"
  echo "100,000 clients, 100 per minute per client, one connection per process. Both peers count"
  echo "fixed windows (INCR-style scripts, cheaper inside Redis than a token bucket): compare them with"
  echo "tollgate's fixed_window row; the last column is against tollgate's token bucket. redis-benchmark runs tollgate's token bucket script"
  echo "with EVALSHA, pipelined (-P 32 -c 64): the most one Redis does here, the ceiling of every"
  echo "client. tollgate: \`redis_bench --callers 64 --clients 100000 --requests $n\`; peers:"
  echo "benches/peers/ for $dur s each. min / median / max of $REPS interleaved repetitions; the ratio"
  echo "is per repetition, against tollgate's RedisStore in the same repetition."
  if [ -n "$lim_bin" ]; then
    echo "limitador-peer was built in ${LIM_BUILD_S:-?} s in this run (${LIM_ENV[*]:-RocksDB compiled from source};"
    echo "a few seconds when cached)."
  fi
  echo
  echo "| client | decisions/s | p50 | p99 | decisions/s vs tollgate RedisStore |"
  echo "|---|---:|---:|---:|---:|"
  echo "| redis-benchmark raw EVALSHA (pipelined, no client logic) | $(stats $raw) | | | $(stats $(ratios "$raw" "$ours")) |"
  echo "| **tollgate RedisStore**, token_bucket (tollgate-redis $(grep -m1 '^version' Cargo.toml | cut -d'"' -f2)) | $(stats $ours) | $(stats $ours50) us | $(stats $ours99) us | 1 |"
  echo "| **tollgate RedisStore**, fixed_window (the peers' algorithm) | $(stats $fw) | $(stats $fw50) us | $(stats $fw99) us | $(stats $(ratios "$fw" "$ours")) |"
  local limver rlfver
  limver=$(grep -A1 '^name = "limitador"$' benches/peers/limitador/Cargo.lock 2>/dev/null | sed -n 's/version = "\(.*\)"/\1/p' || true)
  rlfver=$(node -p 'require("./benches/peers/rate-limiter-flexible/node_modules/rate-limiter-flexible/package.json").version' 2>/dev/null || true)
  if [ -n "$lim_bin" ]; then
    echo "| limitador ${limver} (AsyncRedisStorage) | $(stats $lim) | $(stats $lim50) us | $(stats $lim99) us | $(stats $(ratios "$lim" "$ours")) |"
  else
    echo "| limitador | not measured: build failed: \`${lim_err//|/\\|}\` | | | |"
  fi
  if [ "$rlf_ok" = 1 ]; then
    echo "| rate-limiter-flexible ${rlfver} (RateLimiterRedis, ioredis, node $(node --version)) | $(stats $rlf) | $(stats $rlf50) us | $(stats $rlf99) us | $(stats $(ratios "$rlf" "$ours")) |"
  else
    echo "| rate-limiter-flexible | not measured: ${rlf_err//|/\\|} | | | |"
  fi
}
