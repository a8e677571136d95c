#!/bin/bash
set -euo pipefail
/app/workers/start.sh
sleep 2
# the worker.py process using the most CPU
pid=$(ps -eo pid=,pcpu=,args= --sort=-pcpu | awk '/[w]orker\.py/ { print $1; exit }')
kill "$pid"
echo "$pid" > /app/killed.pid
sleep 0.5
