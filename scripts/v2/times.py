"""Seconds per test file from a pytest junit XML (scripts/test-v2.sh prints them after a
scenario, to choose what fits the time budget in the slow guest)."""

import sys
import xml.etree.ElementTree as ET
from collections import Counter

t: Counter[str] = Counter()
n: Counter[str] = Counter()
for case in ET.parse(sys.argv[1]).iter("testcase"):
    parts = case.get("classname", "?").split(".")
    f = next((p for p in parts if p.startswith("test_")), parts[-1])
    t[f] += float(case.get("time", 0))
    n[f] += 1
print("V2TIMES " + ", ".join(f"{f}={s:.0f}s/{n[f]}" for f, s in t.most_common()))
