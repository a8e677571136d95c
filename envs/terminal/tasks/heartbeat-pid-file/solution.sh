#!/bin/bash
set -euo pipefail
cat > /app/heartbeat.sh <<'SCRIPT'
#!/bin/bash
while true; do
    echo "beat $(date +%s)" >> /app/heartbeat.log
    sleep 1
done
SCRIPT
chmod 755 /app/heartbeat.sh
nohup /app/heartbeat.sh > /dev/null 2>&1 &
echo $! > /app/heartbeat.pid
sleep 1
