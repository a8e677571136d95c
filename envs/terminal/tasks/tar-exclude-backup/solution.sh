#!/bin/bash
set -euo pipefail
mkdir -p /app/backup
cd /app
tar --anchored --exclude='data/cache' --exclude='*.tmp' -czf backup/data-backup.tar.gz data
cd /app/backup
sha256sum data-backup.tar.gz > data-backup.tar.gz.sha256
