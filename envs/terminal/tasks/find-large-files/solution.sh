#!/bin/bash
set -euo pipefail
cd /app/data
find . -type f -size +102400c -printf '%P\n' | LC_ALL=C sort > /app/large_files.txt
find . -type f -name '*.tmp' -print0 | xargs -0 -r rm -f
