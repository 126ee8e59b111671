# scripts/bench: build once, sourced by the driver before the first section. Sets BIN (the
# tollgate binary), REDIS_BENCH, EX (the examples), VS_GOVERNOR, and for the peers section
# LIM_BIN / LIM_ERR / LIM_BUILD_S / LIM_ENV and RLF_OK / RLF_ERR.
# Everything is compiled here, before the first measurement: two cargo invocations (redis_bench
# exactly as scripts/bench-redis builds it, so its own build is a no-op; then every other binary
# in one invocation), then the peers. No section runs cargo.
log "building release binaries (target: $TARGET)"
cargo build --release -q -p tollgate-redis --example redis_bench
BUILD_JSON="$OUT/logs/build.json"
cargo build --release -q --message-format=json-render-diagnostics \
  -p tollgate-gateway --bin tollgate --example http_floor \
  -p tollgate --features tollgate/redis --example lease_bench --example abuse_bench \
  -p tollgate-memory --bench vs_governor --example bytes_per_key \
  -p tollgate-bench --example bar_chart >"$BUILD_JSON"
BIN="$TARGET/release/tollgate"
REDIS_BENCH="$TARGET/release/examples/redis_bench"
EX="$TARGET/release/examples"
# criterion bench binaries live under deps/ with a hash: take the path cargo reports.
VS_GOVERNOR=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "vs_governor" and m.get("executable"):
        print(m["executable"])' "$BUILD_JSON" | tail -n1)

# The peers (benches/peers/): failures are reported in the peers table, not fatal.
# limitador 0.12 to 0.14 only build with their default features, which include RocksDB
# (librocksdb-sys). Built from its C++ sources that takes 50 minutes here; linked against
# Debian's librocksdb-dev instead (ROCKSDB_LIB_DIR; nothing in the peer calls RocksDB, so the
# C API version does not matter) it takes minutes. The peer uses limitador's AsyncRedisStorage.
LIM_BIN="" LIM_ERR="" LIM_BUILD_S="" RLF_OK=0 RLF_ERR=""
if grep -qw peers <<<"$ONLY"; then
  need node nodejs || true
  need npm npm || true
  need cc gcc || true
  if ! ldconfig -p | grep -q 'libclang\(-[0-9.]*\)\?\.so'; then need_pkg libclang-dev || true; fi
  MULTIARCH=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
  LIBDIR="/usr/lib/$MULTIARCH"
  [ -e "$LIBDIR/librocksdb.so" ] || need_pkg librocksdb-dev || true
  LIM_ENV=()
  if [ -e "$LIBDIR/librocksdb.so" ]; then
    LIM_ENV=(ROCKSDB_LIB_DIR="$LIBDIR")
    if [ -e "$LIBDIR/libsnappy.so" ]; then LIM_ENV+=(SNAPPY_LIB_DIR="$LIBDIR"); fi
  else
    log "no system librocksdb: limitador's RocksDB is compiled from C++ (slow; needs g++)"
    need g++ g++ || true
  fi
  if command -v cargo >/dev/null; then
    log "building benches/peers/limitador (${LIM_ENV[*]:-RocksDB from source})"
    lim_t0=$(date +%s)
    if (cd benches/peers/limitador && env "${LIM_ENV[@]}" ZSTD_SYS_USE_PKG_CONFIG=1 \
        CARGO_TARGET_DIR="$ROOT/benches/peers/limitador/target" \
        timeout "${PEER_BUILD_TIMEOUT:-900}" cargo build --release --locked -q) \
        >"$OUT/logs/peer-limitador-build.log" 2>&1; then
      LIM_BIN="$ROOT/benches/peers/limitador/target/release/limitador-peer"
    else
      LIM_ERR=$(grep -m1 -E '^error' "$OUT/logs/peer-limitador-build.log" || true)
      [ -n "$LIM_ERR" ] || LIM_ERR="cargo build did not finish within ${PEER_BUILD_TIMEOUT:-900} s or was stopped"
    fi
    LIM_BUILD_S=$(( $(date +%s) - lim_t0 ))
    log "limitador peer build: ${LIM_BUILD_S}s${LIM_ERR:+ (failed: $LIM_ERR)}"
  else
    LIM_ERR="cargo not found"
  fi
  if command -v npm >/dev/null && command -v node >/dev/null; then
    if (cd benches/peers/rate-limiter-flexible && timeout 300 npm install --no-audit --no-fund --silent) \
        >"$OUT/logs/peer-rlf-install.log" 2>&1; then
      RLF_OK=1
    else
      RLF_ERR=$(grep -m1 -iE 'err' "$OUT/logs/peer-rlf-install.log" || echo "npm install failed")
    fi
  else
    RLF_ERR="node/npm not installed (apt-get install nodejs npm)"
  fi
fi
