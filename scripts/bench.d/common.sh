# scripts/bench's shared helpers, sourced by the driver: logging, installing tools, the
# results file (bench-out/results.jsonl), min / median / max and ratios, and run_section, which
# runs one section in a subshell and turns its stdout into bench-out/sections/NN-NAME.md.
# Expects ROOT, OUT, RESULTS and ONLY from the driver.

log() { echo "[bench $(date -u +%H:%M:%S)] $*" >&2; }

# ---- tools -----------------------------------------------------------------------------------
APT_UPDATED=0
need() { # command, apt package
  command -v "$1" >/dev/null && return 0
  if [ "$(id -u)" != 0 ]; then
    log "$1 missing and not root: install $2 (apt) first"; return 1
  fi
  log "installing $2 (apt)"
  if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}
need_pkg() { # apt package, installed unconditionally when root
  [ "$(id -u)" = 0 ] || { log "not root: install $1 (apt) first"; return 1; }
  log "installing $1 (apt)"
  if [ "$APT_UPDATED" = 0 ]; then apt-get update -qq >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
}

# The tools every section uses, installed with apt when missing (as root).
install_tools() {
  need redis-server redis-server || true
  need redis-benchmark redis-tools || true
  need redis-cli redis-tools || true
  need wrk wrk || true
  need nginx nginx-light || need nginx nginx || true
  need curl curl || true
  need python3 python3 || true
  # nginx from the distribution may be started as a service by the package: leave it alone,
  # we only ever run our own instance on loopback ports from a temporary prefix.
}

# ---- helpers ---------------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# emit BENCH JSON-OBJECT-BODY: appends {"bench":BENCH,...} to results.jsonl and stdout.
emit() {
  local line="{\"bench\":\"$1\",$2}"
  echo "$line" >>"$RESULTS"
}

# Appends every line of FILE that is a JSON object, tagged with the bench name.
emit_json_lines() { # bench, file
  python3 - "$1" "$2" "$RESULTS" <<'PY'
import json, sys
bench, path, out = sys.argv[1:4]
with open(path) as f, open(out, "a") as o:
    for line in f:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        o.write(json.dumps({"bench": bench, **obj}) + "\n")
PY
}

# Appends one JSON line per row of every markdown table in FILE (header cells as keys).
emit_table_rows() { # bench, file
  python3 - "$1" "$2" "$RESULTS" <<'PY'
import json, sys
bench, path, out = sys.argv[1:4]
rows, header = [], None
for line in open(path):
    line = line.strip()
    if not line.startswith("|"):
        header = None
        continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if header is None:
        header = cells
    elif all(set(c) <= set("-: ") for c in cells):
        continue
    else:
        rows.append(dict(zip(header, cells)))
with open(out, "a") as o:
    for r in rows:
        o.write(json.dumps({"bench": bench, "row": r}) + "\n")
PY
}

# Processes a section starts go in SECTION_PIDS; the section's subshell stops them on exit.
SECTION_PIDS=()
stop_section_pids() {
  local p
  for p in "${SECTION_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${SECTION_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  SECTION_PIDS=()
}

# stats v1 v2 ...: "min / median / max" (numbers, any order)
stats() {
  tr ' ' '\n' <<<"$*" | grep -v '^$' | sort -g | awk '
    { a[NR] = $1 } END { if (NR == 0) { print "n/a"; exit } if (NR == 1) { print fmt(a[1]); exit }
      printf "%s / %s / %s", fmt(a[1]), fmt(a[int((NR + 1) / 2)]), fmt(a[NR]) }
    function fmt(x,  ax) { ax = x < 0 ? -x : x; return ax >= 100 ? sprintf("%.0f", x) : sprintf("%.3g", x) }'
}
median() { tr ' ' '\n' <<<"$*" | grep -v '^$' | sort -g | awk '{ a[NR] = $1 } END { print (NR ? a[int((NR + 1) / 2)] : "") }'; }
ratios() { # "a1 a2 ..." "b1 b2 ...": pairwise a/b
  local -a a b; read -ra a <<<"$1"; read -ra b <<<"$2"; local i out=""
  for i in "${!a[@]}"; do
    [ -n "${b[$i]:-}" ] || continue
    out="$out $(awk -v x="${a[$i]}" -v y="${b[$i]}" 'BEGIN { if (y == 0) print ""; else printf "%.3f", x / y }')"
  done
  echo "$out"
}

# run_section NN NAME FUNCTION: runs FUNCTION in a subshell (its own processes stopped on exit),
# its stdout becomes bench-out/sections/NN-NAME.md; a failure is recorded and the run goes on.
FAILED=()
run_section() { # number (place in the document), name, function
  local num=$1 name=$2 fn=$3 rc md
  md="$OUT/sections/$num-$name.md"
  if ! grep -qw "$name" <<<"$ONLY"; then
    emit "$name" '"status":"skipped"'
    # Keep what an earlier run measured (each section compares with its own peers), marked.
    if [ -f "$OUT/previous/$num-$name.md" ]; then
      { grep -v '^\*(Not rerun' "$OUT/previous/$num-$name.md"
        echo
        echo "*(Not rerun in the last run (--only): these figures come from an earlier scripts/bench run on this machine.)*"
      } >"$md"
    else
      printf '### %s\n\nNot measured in this run (skipped with --only).\n' "$name" >"$md"
    fi
    return 0
  fi
  log "section $name"
  local t0; t0=$(date +%s)
  set +e
  (
    set -euo pipefail
    trap stop_section_pids EXIT
    "$fn"
  ) >"$md.tmp" 2>"$OUT/logs/$name.log"
  rc=$?
  set -e
  local secs=$(( $(date +%s) - t0 ))
  if [ "$rc" = 0 ]; then
    mv "$md.tmp" "$md"
    emit "$name" "\"status\":\"ok\",\"seconds\":$secs" >/dev/null
  else
    FAILED+=("$name")
    {
      cat "$md.tmp"
      echo
      echo "**Not measured: this section failed in this run (exit $rc).** Last lines of its log:"
      echo
      echo '```text'
      tail -n 15 "$OUT/logs/$name.log" | cut -c1-200
      echo '```'
    } >"$md"
    rm -f "$md.tmp"
    emit "$name" "\"status\":\"failed\",\"exit\":$rc,\"seconds\":$secs" >/dev/null
    log "section $name FAILED (exit $rc), see bench-out/logs/$name.log"
  fi
  log "section $name took ${secs}s"
}
