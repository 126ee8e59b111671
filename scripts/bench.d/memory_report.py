#!/usr/bin/env python3
"""scripts/bench, section memory: the tables of the memory store against governor, from the
criterion estimates (bench-out/criterion-REP), the paired rounds (memory-REP.txt) and
bytes_per_key (memory-bytes-REP.txt) of every repetition; one JSON line per figure is appended
to results.jsonl.

Usage: memory_report.py OUT REPS RESULTS
"""
import json, os, re, sys
out, reps, results = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CONFIGS = [("hot_key", 1, "one hot key, 1 thread"), ("hot_key", 2, "one hot key, 2 threads"),
           ("random_1m_keys", 1, "1,000,000 random keys, 1 thread"),
           ("random_1m_keys", 2, "1,000,000 random keys, 2 threads")]
def est(rep, *parts):
    with open(os.path.join(out, f"criterion-{rep}", *parts, "new", "estimates.json")) as f:
        return json.load(f)["median"]["point_estimate"]
def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]
def stats(vals, digits):
    v = sorted(vals)
    if not v:
        return "n/a"
    f = lambda x: f"{x:.{digits}f}"
    if len(v) == 1:
        return f(v[0])
    return f"{f(v[0])} / {f(v[(len(v) - 1) // 2])} / {f(v[-1])}"
crit = {c[2]: {"ours": [], "gov": [], "ratio": []} for c in CONFIGS}
clock = {"system_clock": [], "tsc_wall_clock": []}
paired = {c[2]: [[] for _ in range(5)] for c in CONFIGS}
bpk = {"tollgate": [], "governor": [], "ratio": []}
with open(results, "a") as o:
    for rep in range(1, reps + 1):
        for name, threads, label in CONFIGS:
            g = f"{name}_{threads}_thread"
            ours, gov = est(rep, g, "tollgate", str(threads)), est(rep, g, "governor", str(threads))
            crit[label]["ours"].append(ours); crit[label]["gov"].append(gov); crit[label]["ratio"].append(ours / gov)
            o.write(json.dumps({"bench": "memory", "kind": "criterion", "rep": rep, "configuration": label,
                                "tollgate_ns": ours, "governor_ns": gov, "ratio": ours / gov}) + "\n")
        for k in clock:
            clock[k].append(est(rep, "clock", k))
        text = open(os.path.join(out, f"memory-{rep}.txt")).read()
        block = text[text.index("## paired"):text.index("## end")]
        for line in block.splitlines():
            c = cells(line)
            if len(c) == 6 and c[0] in paired:
                vals = [float(x) for x in c[1:]]
                for i, x in enumerate(vals):
                    paired[c[0]][i].append(x)
                o.write(json.dumps({"bench": "memory", "kind": "paired", "rep": rep, "configuration": c[0],
                                    "tollgate_check_ns": vals[0], "governor_ns": vals[1], "ratio_check": vals[2],
                                    "tollgate_check_one_ns": vals[3], "ratio_check_one": vals[4]}) + "\n")
        row = {}
        for line in open(os.path.join(out, f"memory-bytes-{rep}.txt")):
            c = cells(line)
            if line.startswith("|") and len(c) == 4 and c[0] in ("tollgate", "governor"):
                row[c[0]] = float(c[3])
        if len(row) == 2:
            bpk["tollgate"].append(row["tollgate"]); bpk["governor"].append(row["governor"])
            bpk["ratio"].append(row["tollgate"] / row["governor"])
            o.write(json.dumps({"bench": "memory", "kind": "bytes_per_key", "rep": rep, **row,
                                "ratio": row["tollgate"] / row["governor"]}) + "\n")
def table(title, columns, rows, label_first=True):
    """A markdown table under a heading; the first column is left-aligned when it holds labels."""
    print(f"#### {title}")
    print()
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" if label_first and i == 0 else "---:" for i in range(len(columns))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
table("paired: ns per check, median of 60 rotating rounds per run (the ratio to read)",
      ["configuration", "tollgate `check`", "governor `check_key`", "ratio `check` / governor",
       "tollgate `check_one`", "ratio `check_one` / governor"],
      [[label] + [stats(p, d) for p, d in zip(paired[label], (1, 1, 2, 1, 2))] for _, _, label in CONFIGS])
print()
table("criterion medians (each limiter measured in turn)",
      ["configuration", "tollgate ns/check", "governor ns/check", "ratio tollgate/governor"],
      [[label, stats(crit[label]["ours"], 1), stats(crit[label]["gov"], 1), stats(crit[label]["ratio"], 2)]
       for _, _, label in CONFIGS])
print()
print(f"clock read: SystemClock {stats(clock['system_clock'], 1)} ns, TSC wall clock {stats(clock['tsc_wall_clock'], 1)} ns")
print()
table("bytes per key at 1,000,000 keys (RSS growth / keys tracked, each store in a fresh process)",
      ["tollgate", "governor", "ratio tollgate/governor"],
      [[stats(bpk["tollgate"], 1), stats(bpk["governor"], 1), stats(bpk["ratio"], 2)]], label_first=False)
