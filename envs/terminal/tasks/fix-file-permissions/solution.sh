#!/bin/bash
set -euo pipefail
cd /app/project
find . -type d -exec chmod 755 {} +
find . -type f -exec chmod 644 {} +
find scripts -type f -name '*.sh' -exec chmod 755 {} +
chmod 700 secrets
find secrets -type f -exec chmod 600 {} +
