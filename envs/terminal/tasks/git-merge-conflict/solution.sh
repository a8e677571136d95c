#!/bin/bash
set -uo pipefail
cd /app/service
git merge --no-edit feature/retry > /dev/null 2>&1 || true
set -e
cat > config.py <<'PY'
"""Service configuration."""

HOST = "0.0.0.0"
PORT = 8000
TIMEOUT = 60
RETRIES = 3
LOG_LEVEL = "INFO"
PY
printf '# Changelog\n\n## Unreleased\n- Raise default timeout to 60s\n- Add retry support\n\n## 1.0.0\n- First release\n' > CHANGELOG.md
git add config.py CHANGELOG.md
git commit -q --no-edit
