# The processes sections start, all on 127.0.0.1 and free ports, each recorded in
# SECTION_PIDS so the section's subshell stops it on exit (see run_section in common.sh):
# redis-server, nginx in a prefix of its own, and `tollgate serve` configs.

REDIS_PORT=""
start_redis() { # dir: starts a redis-server on a free loopback port, sets REDIS_PORT
  local dir=$1 port pid
  mkdir -p "$dir"
  for _ in 1 2 3 4 5; do
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" \
      --logfile "$dir/redis-$port.log" >/dev/null 2>&1 &
    pid=$!
    SECTION_PIDS+=("$pid")
    for _ in $(seq 1 100); do
      if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
        REDIS_PORT=$port; return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
  done
  echo "could not start redis-server" >&2; return 1
}

script_calls() { # port: evalsha + eval calls so far
  redis-cli -h 127.0.0.1 -p "$1" info commandstats \
    | awk -F'[=,:]' '/^cmdstat_(evalsha|eval):/ { s += $3 } END { print s + 0 }'
}

wait_http() { # url
  for _ in $(seq 1 150); do
    curl -fs -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$1 did not answer" >&2; return 1
}

start_nginx() { # name, http-block body: an nginx in its own prefix, loopback only
  local name=$1 body=$2 dir="$OUT/nginx-$1"
  rm -rf "$dir"; mkdir -p "$dir/logs" "$dir/tmp"
  local user_line=""
  [ "$(id -u)" = 0 ] && user_line="user root;"
  cat >"$dir/nginx.conf" <<CONF
$user_line
worker_processes 1;
daemon off;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  keepalive_requests 1000000;
$body
}
CONF
  nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" >"$dir/logs/stdout.log" 2>&1 &
  SECTION_PIDS+=("$!")
}

serve_config() { # file, port, admin, upstream-or-empty, store table
  {
    echo "[server]"
    echo "listen = \"127.0.0.1:$2\""
    echo "admin_listen = \"127.0.0.1:$3\""
    [ -n "$4" ] && echo "upstream = \"$4\""
    echo "$5"
    echo '[identity]'
    echo 'sources = ["header:x-api-key", "ip"]'
    echo 'secret = "bench"'
    echo '[[policy]]'
    echo 'name = "api"'
    echo 'algorithm = "token_bucket"'
    echo 'limit = 100'
    echo 'period = "1m"'
  } >"$1"
}
