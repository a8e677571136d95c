#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import hashlib
import os
from collections import defaultdict
from pathlib import Path

root = Path("/app/photos")
groups = defaultdict(list)
for path in root.rglob("*"):
    if path.is_file() and not path.is_symlink():
        groups[hashlib.sha256(path.read_bytes()).hexdigest()].append(str(path.relative_to(root)))
pairs = []
for paths in groups.values():
    kept, *dups = sorted(paths, key=lambda p: p.encode())
    for dup in dups:
        target = os.path.relpath(root / kept, (root / dup).parent)
        (root / dup).unlink()
        os.symlink(target, root / dup)
        pairs.append((kept, dup))
pairs.sort(key=lambda kd: kd[1].encode())
Path("/app/dedupe_report.txt").write_text("".join(f"{k}\t{d}\n" for k, d in pairs))
PY
