#!/bin/bash
# Starts the three queue workers in the background and records their PIDs
# in run/worker-<id>.pid next to this script.
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$here/run"
for id in 1 2 3; do
    nohup python3 "$here/worker.py" "$id" > /dev/null 2>&1 &
    echo $! > "$here/run/worker-$id.pid"
done
echo "started 3 workers"
