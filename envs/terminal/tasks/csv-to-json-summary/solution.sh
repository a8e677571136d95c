#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv
import json
from collections import defaultdict

regions = defaultdict(lambda: {"orders": 0, "units": 0, "revenue": 0.0, "by_product": defaultdict(float)})
total = 0.0
with open("/app/data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        qty, revenue = int(row["quantity"]), int(row["quantity"]) * float(row["unit_price"])
        r = regions[row["region"]]
        r["orders"] += 1
        r["units"] += qty
        r["revenue"] += revenue
        r["by_product"][row["product"]] += revenue
        total += revenue
out = {"regions": {}, "total_revenue": round(total, 2)}
for name, r in regions.items():
    top = max(r["by_product"].items(), key=lambda kv: kv[1])[0]
    out["regions"][name] = {"orders": r["orders"], "units": r["units"],
                            "revenue": round(r["revenue"], 2), "top_product": top}
with open("/app/summary.json", "w") as f:
    json.dump(out, f, indent=2)
PY
