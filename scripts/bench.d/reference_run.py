#!/usr/bin/env python3
"""scripts/bench, section reference: the verdict on one run of the reference deployment.
Reads the gateways' and the direct call's `tollgate bench --json` reports and prints one line:
tag rate users achieved p99 direct_p99 added calls/req over users_over under missed+errors
sustained(1/0) reason.

Usage: reference_run.py GATEWAYS.json DIRECT.json CALLS RATE USERS TAG P99_ADDED_MS MIN_ACHIEVED MAX_MISSED
"""
import json, sys
gj, dj, calls, rate, users, tag, p99max, minach, maxmiss = sys.argv[1:10]
r = json.load(open(gj)); d = json.load(open(dj))
rate, calls = float(rate), int(calls)
sent = r["requests"]["sent"] or 1
bad = r["requests"]["missed"] + r["requests"]["errors"]
acc = r.get("accuracy") or {}
over = acc.get("over_admission", {}); under = acc.get("under_admission", {})
t = r["throughput"]["sent_per_s"]
p99, dp99 = r["latency"]["all"]["p99_us"], d["latency"]["all"]["p99_us"]
added = p99 - dp99
why = []
if added > float(p99max) * 1000: why.append(f"p99_added_{added}us>{p99max}ms")
if t < float(minach) * rate: why.append(f"achieved_{t:.0f}<{float(minach):.0%}")
if bad > float(maxmiss) * (sent + r["requests"]["missed"]): why.append(f"missed+errors_{bad}")
ok = 0 if why else 1
print(tag, int(rate), users, f"{t:.1f}", p99, dp99, added, f"{calls / sent:.3f}", over.get("total", "nan"),
      over.get("clients", "nan"), under.get("total", "nan"), bad, ok, ",".join(why) or "-")
