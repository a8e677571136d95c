#!/bin/bash
set -euo pipefail
head -n 13 /app/sync_txt.sh > /tmp/sync_txt.sh
cat >> /tmp/sync_txt.sh <<'SCRIPT'

src=$1
dest=$2

if [ ! -d "$src" ]; then
    echo "sync_txt: no such directory: $src" >&2
    exit 1
fi

shopt -s dotglob
mkdir -p -- "$dest"
count=0
for path in "$src"/*.txt; do
    [ -f "$path" ] || continue
    cp -f -- "$path" "$dest/"
    count=$((count + 1))
done
echo "copied $count files"
SCRIPT
cat /tmp/sync_txt.sh > /app/sync_txt.sh
rm /tmp/sync_txt.sh
