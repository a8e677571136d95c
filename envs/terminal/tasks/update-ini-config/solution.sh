#!/bin/bash
set -euo pipefail
cd /app/config
sed -i -e '/^\[server\]/,/^\[/ { s/^port = .*/port = 9090/; s/^debug = .*/debug = false/ }' \
       -e '/^\[logging\]/,/^\[/ s/^level = .*/level = WARNING/' app.ini
printf '\n[cache]\nbackend = memory\nttl = 300\n' >> app.ini
printf 'APP_ENV=production\nAPP_PORT=9090\n' > .env
