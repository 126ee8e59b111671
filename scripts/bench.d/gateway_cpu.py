#!/usr/bin/env python3
"""CPU per request of a rate-limiting gateway, each pinned alone to one core, side by side.

    scripts/bench.d/gateway_cpu.py --tollgate BIN [--tollgate LABEL=BIN ...]
        [--floor BIN] [--reps N] [--duration 6s] [--json FILE] [--gateway-cpu 1] [--load-cpu 0]

The gateway under test runs alone on --gateway-cpu (taskset); wrk, the upstream (an nginx
answering 200) and redis-server share --load-cpu. Every request carries one of 100,000 API
keys drawn at random (wrk Lua, requests formatted once), limit 100/min per key, so almost
every request is allowed and each is a store call. Cases, interleaved in every repetition:
nginx `limit_req` answering 200 itself (decision) or with `proxy_pass` to the upstream (proxy),
and `tollgate serve` in decision and proxy mode with the memory and the Redis store; with
--floor, the example http_floor (the gateway's HTTP server and runtime answering the same 200
with no limiter: the floor under decision mode). The
gateway's CPU is its utime + stime (/proc/PID/stat) over the wrk run divided by the requests
wrk completed: what a request costs the gateway whatever the load generator's own speed.
Prints a markdown table (median of the repetitions; the ratio is to nginx in the same mode and
the same repetition, median over repetitions) and, with --json, one JSON object per run.
Needs nginx, wrk, redis-server, taskset and two CPUs. Loopback only; it stops what it starts.
"""
import argparse, json, os, re, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

WRK_LUA = r"""
-- One of N pre-formatted requests per call (x-api-key: k1..kN), chosen at random; statuses
-- tallied; done() prints one line `RESULT {json}` (latencies in microseconds).
local n = tonumber(os.getenv("KEYS") or "100000")
local threads, reqs = {}, {}
function setup(t) table.insert(threads, t) end
function init(args)
  statuses = {}
  math.randomseed(7)
  for i = 1, n do reqs[i] = wrk.format(nil, nil, { ["x-api-key"] = "k" .. i }) end
end
function request() return reqs[math.random(n)] end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local all = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("statuses") or {}) do all[k] = (all[k] or 0) + v end
  end
  local s = {}
  for k, v in pairs(all) do table.insert(s, string.format('"%d":%d', k, v)) end
  local e = summary.errors
  io.write(string.format('RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,' ..
    '"socket_errors":%d,"status":{%s}}\n', summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.connect + e.read + e.write + e.timeout,
    table.concat(s, ",")))
end
"""

NGINX_CONF = """daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;
error_log {d}/error.log error;
events {{ worker_connections 8192; }}
http {{ access_log off; keepalive_requests 1000000; keepalive_timeout 75s;
client_body_temp_path {d}/t1; proxy_temp_path {d}/t2; fastcgi_temp_path {d}/t3;
uwsgi_temp_path {d}/t4; scgi_temp_path {d}/t5;
{body}
}}
"""
LIMIT_REQ = ("limit_req_zone $http_x_api_key zone=api:64m rate=100r/m;",
             "limit_req zone=api burst=100 nodelay; limit_req_status 429;")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """The processes of one run: each started pinned, each stopped at the end."""

    def __init__(self, args):
        self.args, self.procs = args, []
        self.dir = tempfile.mkdtemp(prefix="gateway-cpu-")
        self.lua = os.path.join(self.dir, "keys.lua")
        with open(self.lua, "w") as f:
            f.write(WRK_LUA)

    def start(self, name, cmd, cpu, port, env=None):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(["taskset", "-c", str(cpu)] + cmd, stdout=log, stderr=log, env=env)
        self.procs.append(p)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise SystemExit(f"{name} exited before listening; see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return p
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"{name} did not listen on {port}")

    def stop(self, p):
        if p.poll() is None:
            p.send_signal(signal.SIGQUIT if "nginx" in p.args else signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.remove(p)

    def nginx(self, name, body, cpu, port):
        d = os.path.join(self.dir, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(NGINX_CONF.format(d=d, body=body))
        return self.start(name, ["nginx", "-p", d, "-c", f"{d}/nginx.conf", "-e", f"{d}/error.log"],
                          cpu, port)

    def tollgate(self, label, binary, mode, store, port, upstream, redis_port):
        cfg = os.path.join(self.dir, f"{label}-{mode}-{store}.toml")
        lines = ["[server]", f'listen = "127.0.0.1:{port}"', f'admin_listen = "127.0.0.1:{free_port()}"']
        if mode == "proxy":
            lines.append(f'upstream = "http://127.0.0.1:{upstream}"')
        lines.append("[store]")
        if store == "redis":
            lines += ['backend = "redis"', f'url = "redis://127.0.0.1:{redis_port}"']
        else:
            lines.append('backend = "memory"')
        lines += ["[identity]", 'sources = ["header:x-api-key", "ip"]', 'secret = "bench"',
                  "[[policy]]", 'name = "api"', 'algorithm = "token_bucket"', "limit = 100",
                  'period = "1m"']
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        env = dict(os.environ, TOLLGATE_LOG="warn")
        return self.start(f"{label}-{mode}-{store}", [binary, "serve", "--config", cfg],
                          self.args.gateway_cpu, port, env)

    def wrk(self, port):
        env = dict(os.environ, KEYS="100000")
        r = subprocess.run(["taskset", "-c", str(self.args.load_cpu), "wrk", "-t1", "-c64",
                            f"-d{self.args.duration}", "--latency", "-s", self.lua,
                            f"http://127.0.0.1:{port}/"],
                           capture_output=True, text=True, env=env, timeout=300)
        m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
        if not m:
            raise SystemExit(f"wrk failed: {r.stdout}\n{r.stderr}")
        return json.loads(m.group(1))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(lab, name, proc, port):
    time.sleep(0.3)
    c0 = cpu_seconds(proc.pid)
    w = lab.wrk(port)
    c1 = cpu_seconds(proc.pid)
    n = max(w["requests"], 1)
    return {"name": name, "requests": w["requests"],
            "requests_per_s": round(w["requests"] / (w["duration_us"] / 1e6)),
            "p50_us": w["p50_us"], "p99_us": w["p99_us"], "cpu_us_per_request": round((c1 - c0) / n * 1e6, 2),
            "socket_errors": w["socket_errors"], "status": w["status"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tollgate", action="append", required=True, help="BIN or LABEL=BIN")
    ap.add_argument("--floor", action="append", default=[], help="the http_floor example: BIN or LABEL=BIN")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--duration", default="6s")
    ap.add_argument("--json")
    ap.add_argument("--gateway-cpu", type=int, default=1)
    ap.add_argument("--load-cpu", type=int, default=0)
    args = ap.parse_args()
    binaries = []
    for t in args.tollgate:
        label, _, binary = t.rpartition("=")
        binaries.append((label or "tollgate", os.path.abspath(binary)))
    for tool in ("nginx", "wrk", "redis-server", "redis-cli", "taskset"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is needed")
    lab = Lab(args)
    out = open(args.json, "a") if args.json else None
    gw, up, rp = free_port(), free_port(), free_port()
    try:
        lab.nginx("upstream", f'server {{ listen 127.0.0.1:{up} backlog=4096; location / {{ return 200 "ok\\n"; }} }}',
                  args.load_cpu, up)
        lab.start("redis", ["redis-server", "--port", str(rp), "--bind", "127.0.0.1", "--save", "",
                            "--appendonly", "no"], args.load_cpu, rp)
        ngx = {"decision": f'{LIMIT_REQ[0]} server {{ listen 127.0.0.1:{gw} backlog=4096; '
                           f'location / {{ {LIMIT_REQ[1]} return 200 "ok\\n"; }} }}',
               "proxy": f"upstream backend {{ server 127.0.0.1:{up}; keepalive 1024; }} {LIMIT_REQ[0]} "
                        f"server {{ listen 127.0.0.1:{gw} backlog=4096; location / {{ {LIMIT_REQ[1]} "
                        'proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; } }'}
        cases = []
        for mode in ("decision", "proxy"):
            cases.append((f"nginx {mode}", mode, lambda m=mode: lab.nginx("gateway", ngx[m], args.gateway_cpu, gw)))
            for f in args.floor if mode == "decision" else []:
                label, _, binary = f.rpartition("=")
                cases.append((f"{label or 'http floor'} (no limiter)", mode,
                              lambda b=os.path.abspath(binary): lab.start(
                                  "floor", [b, f"127.0.0.1:{gw}"], args.gateway_cpu, gw)))
            for label, binary in binaries:
                for store in ("memory", "redis"):
                    cases.append((f"{label} {mode} {store}", mode,
                                  lambda l=label, b=binary, m=mode, s=store: lab.tollgate(l, b, m, s, gw, up, rp)))
        runs = {}
        for rep in range(args.reps):
            for name, _, start in cases:
                subprocess.run(["redis-cli", "-p", str(rp), "flushall"], capture_output=True, check=True)
                p = start()
                try:
                    r = dict(measure(lab, name, p, gw), rep=rep + 1)
                finally:
                    lab.stop(p)
                print(json.dumps(r), file=sys.stderr, flush=True)
                if out:
                    out.write(json.dumps({"bench": "gateway_cpu", **r}) + "\n")
                runs.setdefault(name, []).append(r)
    finally:
        for p in list(lab.procs):
            lab.stop(p)
        shutil.rmtree(lab.dir, ignore_errors=True)
    print("| gateway on one core | requests/s | p99 ms | CPU µs per request | vs nginx, same mode | non-200 |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, mode, _ in cases:
        rs = runs[name]
        base = runs[f"nginx {mode}"]
        ratio = statistics.median(a["cpu_us_per_request"] / b["cpu_us_per_request"] for a, b in zip(rs, base))
        med = lambda k: statistics.median(r[k] for r in rs)
        non200 = sum(sum(v for k, v in r["status"].items() if k != "200") + r["socket_errors"] for r in rs)
        print(f"| {name} | {med('requests_per_s'):.0f} | {med('p99_us') / 1000:.1f} | "
              f"{med('cpu_us_per_request'):.1f} | {ratio:.2f} | {non200} |")


if __name__ == "__main__":
    main()
