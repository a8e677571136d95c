#!/bin/bash
set -euo pipefail
mkdir -p /app/site/api
printf '<!doctype html>\n<html><body><h1>nextstate is up</h1></body></html>\n' > /app/site/index.html
printf '{"status": "ok", "version": 3}\n' > /app/site/api/status.json
cd /app/site
nohup python3 -m http.server 8000 --bind 127.0.0.1 > /dev/null 2>&1 &
sleep 1
