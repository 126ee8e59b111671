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
for old, new in edits:
    if source.count(old) != 1:
        sys.exit(f"{sys.argv[1]}: cannot find where to patch: {old[:60]!r}")
    source = source.replace(old, new)
open(sys.argv[2], "w").write(source)
