#!/bin/bash
set -euo pipefail
cd /app
mkdir -p report
awk '{ print $1 }' logs/access.log | LC_ALL=C sort | uniq -c \
  | LC_ALL=C sort -k1,1nr -k2,2 | head -n 5 | awk '{ print $1, $2 }' > report/top_ips.txt
awk '{ print $9 }' logs/access.log | LC_ALL=C sort | uniq -c \
  | jq -Rn '[inputs | capture("^ *(?<n>[0-9]+) (?<code>[0-9]+)$") | {(.code): (.n | tonumber)}] | add' \
  > report/status_counts.json
awk '$9 ~ /^5/ { split($7, p, "?"); print p[1] }' logs/access.log | LC_ALL=C sort -u > report/server_errors.txt
