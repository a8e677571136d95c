#!/bin/bash
set -euo pipefail
mkdir -p /app/scripts /app/logs
cat > /app/crontab.txt <<'CRON'
# m  h  dom mon dow  command
30 2 * * * /app/scripts/backup.sh >> /app/logs/backup.log 2>&1
0 9 * * 1 /app/scripts/report.sh >> /app/logs/report.log 2>&1
*/15 * * * * /app/scripts/cleanup.sh >> /app/logs/cleanup.log 2>&1
CRON
