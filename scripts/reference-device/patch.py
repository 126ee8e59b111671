#!/usr/bin/env python3
"""Writes a copy of reference_full.py (argv[1]) to argv[2] with three settings of its own:
TG (the gateway binary's name in $CARRY/bin), BENCH (the load generator's) and STORE_EXTRA
(lines added to every gateway's [store]). Fails if the script changed where it is patched."""
import sys

source = open(sys.argv[1]).read()
edits = [
    ('gateways.append(spawn([os.path.join(B, "tollgate"), "serve"',
     'gateways.append(spawn([os.path.join(B, os.environ.get("TG", "tollgate")), "serve"'),
    ('r = subprocess.run([os.path.join(B, "tollgate"), "bench"',
     'r = subprocess.run([os.path.join(B, os.environ.get("BENCH", "tollgate")), "bench"'),
    ('    for i in range(N):\n        cfg = os.path.join(W, f"gw{i}.toml")',
     '    extra = os.environ.get("STORE_EXTRA", "")\n'
     '    if extra and store != "memory":\n        st = st + extra + "\\n"\n'
     '    for i in range(N):\n        cfg = os.path.join(W, f"gw{i}.toml")'),
]
# A sampler, once a second, of every gateway's and Redis's threads: CPU time and time spent
# runnable but waiting for a CPU (/proc/PID/task/TID/schedstat), the worst single thread's
# wait, and the machine's runnable threads; each phase's start and end beside them. It says
# whether a second whose p99 stalls is a second in which threads waited for a CPU.
SAMPLER = r"""
import threading

SCHED = open(os.path.join(OUT, "schedstat.jsonl"), "a")


def sched_sample(pids, prev):
    cpu = wait = worst = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    c, w = (int(x) for x in f.read().split()[:2])
            except (OSError, ValueError):
                continue
            pc, pw = prev.get((pid, tid), (c, w))
            prev[(pid, tid)] = (c, w)
            cpu += c - pc
            wait += w - pw
            worst = max(worst, w - pw)
    return {"cpu_ms": round(cpu / 1e6, 1), "wait_ms": round(wait / 1e6, 1), "worst_thread_wait_ms": round(worst / 1e6, 1)}


def sched_sampler():
    prev = {}
    while True:
        t = time.time()
        rec = {"t": round(t, 3)}
        rec["gateways"] = sched_sample([p.pid for p in list(gateways)], prev)
        rec["redis"] = sched_sample([p.pid for p in list(procs) if p.args[0].endswith("redis-server")], prev)
        try:
            with open("/proc/stat") as f:
                rec["procs_running"] = int(next(l for l in f if l.startswith("procs_running")).split()[1])
        except (OSError, StopIteration, ValueError):
            pass
        SCHED.write(json.dumps(rec) + "\n")
        SCHED.flush()
        time.sleep(max(0.0, 1.0 - (time.time() - t)))


threading.Thread(target=sched_sampler, daemon=True).start()


def redis_latency(*args):
    # Redis's own latency monitor (events of 5 ms or more: commands, expiry cycles, ...).
    ports = [RP] + list(cluster_ports)
    out = {}
    for port in ports:
        r = subprocess.run([os.path.join(B, "redis-cli"), "-p", str(port)] + list(args),
                           capture_output=True, text=True, env=ENV)
        out[port] = r.stdout.strip()
    return out


def marked(run):
    def phase(label, *args, **kwargs):
        redis_latency("config", "set", "latency-monitor-threshold", "5")
        redis_latency("latency", "reset")
        t0 = time.time()
        try:
            return run(label, *args, **kwargs)
        finally:
            SCHED.write(json.dumps({"phase": label, "start": round(t0, 3), "end": round(time.time(), 3),
                                    "redis_latency": redis_latency("latency", "latest")}) + "\n")
            SCHED.flush()
    return phase


wrk_closed = marked(wrk_closed)
wrk_closed_cluster = marked(wrk_closed_cluster)
bench_open = marked(bench_open)

try: main()"""
edits.append(("\ntry: main()", SAMPLER))
# REDIS_ARGS: more arguments for the one redis-server (e.g. "--hz 100").
edits.append(('"--appendonly", "no", "--maxclients", "50000"], "redis.log")',
              '"--appendonly", "no", "--maxclients", "50000"] + os.environ.get("REDIS_ARGS", "").split(), "redis.log")'))
for old, new in edits:
    if source.count(old) != 1:
        sys.exit(f"{sys.argv[1]}: cannot find where to patch: {old[:60]!r}")
    source = source.replace(old, new)
open(sys.argv[2], "w").write(source)
