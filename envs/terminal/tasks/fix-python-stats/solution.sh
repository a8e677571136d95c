#!/bin/bash
set -euo pipefail
cat > /app/stats.py.new <<'PY'
import sys


def read_values(handle):
    values = []
    for line in handle:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        values.append(float(text))
    return values


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def main():
    path = sys.argv[1]
    if path == "-":
        values = read_values(sys.stdin)
    else:
        with open(path) as handle:
            values = read_values(handle)
    if not values:
        print("stats: no numbers", file=sys.stderr)
        return 1
    mean = sum(values) / len(values)
    print(f"count={len(values)} mean={mean:.2f} median={median(values):.2f} "
          f"min={min(values):.2f} max={max(values):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
# keep the original docstring on top of the fixed code
python3 - <<'PY'
import ast
old = open("/app/stats.py").read()
doc = ast.get_docstring(ast.parse(old), clean=False)
new = open("/app/stats.py.new").read()
open("/app/stats.py", "w").write('"""' + doc + '"""\n\n' + new)
PY
rm /app/stats.py.new
