# scripts/bench, section reference: the reference deployment scaled to this machine (20
# gateways, one Redis, driven by `tollgate bench`). Copies its chart to docs/bench/reference.svg.

# The reference deployment: 20 gateways on one redis-server, driven by `tollgate bench`. "As
# many users as the box sustains" is a bounded search: the offered rate (and with it the number
# of users, RATE / PER_USER) goes up a fixed ladder, one run per step, until a step is not
# sustained (see REF_* below) or the ladder or the time budget ends; the highest sustained step
# is then run --reps times in all for the min / median / max table.
REF_P99_ADDED_MS=10   # sustained: p99 added over the direct call at most this many ms,
REF_MIN_ACHIEVED=0.97 # the achieved rate at least this share of the offered rate,
REF_MAX_MISSED=0.01   # and missed + errors at most this share of the scheduled requests.
section_reference() {
  local gateways=20 per_user=20 dur=8 direct_dur=4 budget=130
  local ladder="2000 3000 4500 6750 10000 15000"
  if [ "$QUICK" = 1 ]; then dur=4; direct_dur=2; ladder="1000 2000"; budget=30; fi
  local t0; t0=$(date +%s)
  start_redis "$OUT/reference-redis"
  local rport=$REDIS_PORT up
  up=$(free_port)
  start_nginx refup "  server { listen 127.0.0.1:$up; location / { return 200 \"ok\\n\"; } }"
  wait_http "http://127.0.0.1:$up/"
  local targets="" g p a
  rm -f "$OUT/ref-admins"
  for g in $(seq 1 "$gateways"); do
    p=$(free_port); a=$(free_port)
    serve_config "$OUT/ref-$g.toml" "$p" "$a" "" \
      "$(printf '[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s"\ntimeout = "200ms"' "$rport")"
    TOLLGATE_LOG=warn "$BIN" serve --config "$OUT/ref-$g.toml" >"$OUT/logs/ref-$g.log" 2>&1 &
    SECTION_PIDS+=("$!")
    targets="$targets,http://127.0.0.1:$p/"
    echo "$a" >>"$OUT/ref-admins"
  done
  targets=${targets#,}
  while read -r a; do wait_http "http://127.0.0.1:$a/healthz"; done <"$OUT/ref-admins"
  rm -f "$OUT/ref-admins" "$OUT"/reference-*.json "$OUT/reference-runs.txt"

  # ref_run RATE TAG: the direct call then the 20 gateways at RATE; appends one line to
  # reference-runs.txt: tag rate users achieved p99 direct_p99 added calls/req over users_over
  # under missed+errors sustained(1/0) reason. Returns 0 when the run was sustained.
  ref_run() {
    local rate=$1 tag=$2 users=$(( $1 / per_user )) before after dj gj
    dj="$OUT/reference-direct-$rate-$tag.json"; gj="$OUT/reference-$rate-$tag.json"
    "$BIN" bench --quiet --target "http://127.0.0.1:$up/" --clients "$users" --rate "$rate" \
      --duration "${direct_dur}s" --connections 256 --limit 100 --period 1m --json "$dj" >/dev/null \
      || { echo "tollgate bench (direct, $rate req/s) failed" >&2; return 2; }
    before=$(script_calls "$rport")
    "$BIN" bench --quiet --target "$targets" --clients "$users" --rate "$rate" \
      --duration "${dur}s" --connections 256 --limit 100 --period 1m --json "$gj" \
      --svg "$OUT/reference-$rate-$tag.svg" >/dev/null \
      || { echo "tollgate bench (gateways, $rate req/s) failed" >&2; return 2; }
    after=$(script_calls "$rport")
    python3 "$BENCH_D/reference_run.py" "$gj" "$dj" "$((after - before))" "$rate" "$users" "$tag" \
      "$REF_P99_ADDED_MS" "$REF_MIN_ACHIEVED" "$REF_MAX_MISSED" >>"$OUT/reference-runs.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || return 2
    local line; line=$(tail -n1 "$OUT/reference-runs.txt")
    local f; read -ra f <<<"$line"
    emit reference "\"tag\":\"$tag\",\"rate\":${f[1]},\"users\":${f[2]},\"sent_per_s\":${f[3]},\"p99_us\":${f[4]},\"direct_p99_us\":${f[5]},\"added_p99_us\":${f[6]},\"redis_calls_per_request\":${f[7]},\"over_admission_total\":${f[8]},\"over_admission_clients\":${f[9]},\"under_admission_total\":${f[10]},\"missed_or_errors\":${f[11]},\"sustained\":${f[12]},\"why_not\":\"${f[13]}\"" >/dev/null
    [ "${f[12]}" = 1 ]
  }

  local rate best="" failed="" first="" stop="the ladder ended" steps=0 rc
  for rate in $ladder; do
    first=${first:-$rate}
    if [ $(( $(date +%s) - t0 )) -ge "$budget" ]; then stop="the time budget (${budget} s) ran out"; break; fi
    steps=$((steps + 1))
    log "reference search: $rate req/s, $((rate / per_user)) users"
    rc=0
    ref_run "$rate" search || rc=$?
    if [ "$rc" = 0 ]; then
      best=$rate
    elif [ "$rc" = 2 ]; then
      stop="the run at $rate req/s failed (see bench-out/logs/reference.log)"; break
    else
      stop="$rate req/s was not sustained ($(tail -n1 "$OUT/reference-runs.txt" | awk '{ print $NF }' | tr '_' ' '))"
      failed=$rate
      break
    fi
  done
  # Then at most two bisection steps between the highest sustained step and the first that
  # was not (rates rounded to 250), within the same time budget.
  local mid i
  for i in 1 2; do
    [ -n "$best" ] && [ -n "$failed" ] || break
    mid=$(( (best + failed) / 2 / 250 * 250 ))
    [ "$mid" -gt "$best" ] && [ "$mid" -lt "$failed" ] || break
    if [ $(( $(date +%s) - t0 )) -ge "$budget" ]; then break; fi
    log "reference search (bisect): $mid req/s, $((mid / per_user)) users"
    rc=0
    ref_run "$mid" search || rc=$?
    if [ "$rc" = 0 ]; then best=$mid; else failed=$mid; [ "$rc" = 2 ] && break; fi
  done
  [ -z "$failed" ] || stop="$failed req/s was not sustained ($(awk -v r="$failed" '$1 == "search" && $2 == r { print $NF }' "$OUT/reference-runs.txt" | tail -n1 | tr '_' ' ' | sed 's/,/, /g'))"
  local conf=${best:-$first} rep
  for rep in $(seq 2 "$REPS"); do
    log "reference rep $rep/$REPS at $conf req/s"
    ref_run "$conf" "rep$rep" || true
  done
  cp "$OUT/reference-$conf-search.svg" "$ROOT/docs/bench/reference.svg" 2>/dev/null || true

  echo "### Reference deployment, scaled to this machine"
  echo
  echo "DESIGN.md's reference load is 20 gateways, 50,000 requests/s, 100 requests/min per user."
  echo "Here: $gateways \`tollgate serve\` processes (decision mode, token_bucket 100/min per"
  echo "\`header:x-api-key\`, Redis store timeout 200ms) on one redis-server, all on $(nproc) cores"
  echo "with the load generator. Each run: \`tollgate bench --target <$gateways urls> --clients U --rate R"
  echo "--duration ${dur}s --connections 256 --limit 100 --period 1m\`, U = R / $per_user (each user offers"
  echo "$per_user requests/s, $((per_user * dur)) in a run against the $((100 + dur * 100 / 60)) its bucket allows, so every user is"
  echo "limited and exactness is tested), just after the same bench for ${direct_dur} s against an nginx"
  echo "answering 200 (the direct call). Redis calls per request: INFO commandstats (evalsha + eval)"
  echo "over the run / requests sent. Over-admission: requests admitted beyond what the limit allows,"
  echo "summed over all users (0 = exact)."
  echo
  echo "**How many users the box sustains**: the offered rate climbs the ladder $(tr ' ' '/' <<<"$ladder") req/s"
  echo "(one run per step) and stops at the first step that is not sustained; then at most two"
  echo "bisection steps between the last sustained rate and that one; ${budget} s at most in all. Sustained = p99 added over the direct call at most ${REF_P99_ADDED_MS} ms, achieved rate at"
  echo "least $(awk -v x="$REF_MIN_ACHIEVED" 'BEGIN { printf "%d", x * 100 }')% of the offered rate, and missed + errors (requests the"
  echo "open-loop schedule could not send, or failed) at most $(awk -v x="$REF_MAX_MISSED" 'BEGIN { printf "%g", x * 100 }')% of those scheduled."
  echo
  echo "| step | offered req/s | users | achieved req/s | p99 | direct p99 | p99 added | Redis calls / request | over-admitted (total) | missed + errors | sustained |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  local n=0 tag r u t p dp ad c ov ovc un miss ok why
  while read -r tag r u t p dp ad c ov ovc un miss ok why; do
    [ "$tag" = search ] || continue
    n=$((n + 1))
    why=${why//_/ }
    echo "| $n | $r | $u | $t | $p us | $dp us | $ad us | $c | $ov | $miss | $([ "$ok" = 1 ] && echo yes || echo "no: ${why//,/, }") |"
  done <"$OUT/reference-runs.txt"
  echo
  if [ -n "$best" ]; then
    echo "**Highest sustained: $best requests/s, $((best / per_user)) users** (20 gateways, one Redis, $(nproc) cores"
    echo "shared with the load generator); the search stopped because $stop."
  else
    echo "**No step was sustained** (the search stopped because $stop); the table below is at the first step."
  fi
  echo
  echo "At $conf req/s ($((conf / per_user)) users), the search's run and $((REPS - 1)) more: min / median / max of $REPS runs."
  echo
  echo "| offered req/s | users | achieved req/s | p99 | direct p99 | p99 added | Redis calls / request | over-admitted (total) | users over | missed + errors | runs sustained |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  local T="" P="" DP="" AD="" C="" OV="" OVC="" MISS="" OKS=0 NR=0
  while read -r tag r u t p dp ad c ov ovc un miss ok why; do
    [ "$r" = "$conf" ] || continue
    case "$tag" in search|rep*) ;; *) continue ;; esac
    T="$T $t"; P="$P $p"; DP="$DP $dp"; AD="$AD $ad"; C="$C $c"; OV="$OV $ov"; OVC="$OVC $ovc"; MISS="$MISS $miss"
    NR=$((NR + 1)); OKS=$((OKS + ok))
  done <"$OUT/reference-runs.txt"
  echo "| $conf | $((conf / per_user)) | $(stats $T) | $(stats $P) us | $(stats $DP) us | $(stats $AD) us | $(stats $C) | $(stats $OV) | $(stats $OVC) | $(stats $MISS) | $OKS of $NR |"
  echo
  [ -f "$ROOT/docs/bench/reference.svg" ] && echo "![reference deployment at $conf req/s](bench/reference.svg)"
  return 0
}
