#!/bin/bash
set -euo pipefail
cd /app/calc
first=$(git rev-list --max-parents=0 HEAD)
git bisect start HEAD "$first" > /dev/null
git bisect run ./check.sh > /tmp/bisect.log 2>&1
git rev-parse refs/bisect/bad > /app/first_bad.txt
git bisect reset -q main 2>/dev/null || git bisect reset main > /dev/null
sed -i 's|    return part \* 100 // whole|    return part / whole * 100|' calc.py
./check.sh
git commit -q -am "Fix percentage helper"
