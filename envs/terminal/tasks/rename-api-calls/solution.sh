#!/bin/bash
set -euo pipefail
cd /app/src
find . -path ./vendor -prune -o -type f -name '*.py' -print0 \
  | xargs -0 grep -lw 'fetch_data' | sed 's|^\./||' | LC_ALL=C sort > /app/changed_files.txt
tr '\n' '\0' < /app/changed_files.txt | xargs -0 -r sed -i 's/\bfetch_data\b/load_data/g'
