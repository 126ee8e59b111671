#!/usr/bin/env python3
"""Summarises the steps of scripts/reference-device/steps: for every phase of every step
(OUT/LABEL/reference_full.jsonl), its rate, latency, CPU a request by process (open-loop phases:
CPU seconds / requests), script calls a request, statuses and over-admission, and for open-loop
phases the p99 of each second."""
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "reference_full.jsonl"))):
    step = f.split("/")[-2]
    for line in open(f):
        d = json.loads(line)
        if d["phase"] == "machine": continue
        lat = (d.get("latency") or {}).get("all") or {}
        cpu = d.get("cpu_us_per_req") or {}
        if "cpu_s" in d and lat.get("count"):
            n = lat["count"]; cpu = {k: round(v / n * 1e6, 2) for k, v in d["cpu_s"].items()}
        print(step, "|", d["phase"], "| rps", d.get("rps"), "| n", lat.get("count"), "| p99", lat.get("p99_us", d.get("p99_us_median")),
              "p999", lat.get("p999_us"), "max", lat.get("max_us"), "| cpu/req", cpu, "| calls/req", d.get("script_calls_per_req"),
              "| st", d.get("status"), "| acc", (d.get("accuracy") or {}).get("over_admission"))
        jf = os.path.join(os.path.dirname(f), d["phase"].replace(" ", "_") + ".json")
        if os.path.exists(jf):
            r = json.load(open(jf))
            print("   timeline p99 ms:", [round(t["p99_us"] / 1000, 1) for t in r.get("timeline", [])], "sent", r.get("requests"))

# Per second of each phase: the bench's p99 (open-loop phases) beside what the threads did.
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*", "schedstat.jsonl"))):
    step = f.split("/")[-2]
    samples, phases = [], []
    for line in open(f):
        d = json.loads(line)
        (phases if "phase" in d else samples).append(d)
    for ph in phases:
        inside = [s for s in samples if ph["start"] < s["t"] <= ph["end"] + 0.5]
        if not inside:
            continue
        jf = os.path.join(os.path.dirname(f), ph["phase"].replace(" ", "_") + ".json")
        p99 = []
        if os.path.exists(jf):
            p99 = [round(t["p99_us"] / 1000, 1) for t in json.load(open(jf)).get("timeline", [])]
        print(f"{step} | {ph['phase']}: second (the sampler's ticks from the phase's start; the bench's own seconds start after its warm-up, so pair them to within one), bench p99 ms, gateways cpu ms / runnable-wait ms / worst thread's wait ms, redis wait ms, runnable threads")
        for port, latest in (ph.get("redis_latency") or {}).items():
            if latest:
                print(f"   redis {port} LATENCY LATEST (event, time, latest ms, max ms): {' '.join(latest.split())}")
        for n, s in enumerate(inside):
            g, r = s.get("gateways", {}), s.get("redis", {})
            print(f"   {n:3d} {p99[n] if n < len(p99) else '-':>6} {g.get('cpu_ms')} / {g.get('wait_ms')} / {g.get('worst_thread_wait_ms')} {r.get('wait_ms')} {s.get('procs_running')}")
