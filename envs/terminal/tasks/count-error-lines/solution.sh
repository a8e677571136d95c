#!/bin/bash
set -euo pipefail
cd /app
awk '$2 == "ERROR"' logs/app.log | wc -l | tr -d ' ' > error_count.txt
awk '$2 == "ERROR" { sub(/:$/, "", $3); print $3 }' logs/app.log | sort -u > error_components.txt
