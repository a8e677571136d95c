#!/bin/bash
# Builds /app/service: main and feature/retry both change config.py and CHANGELOG.md.
set -euo pipefail
git config --global user.name "Agent"
git config --global user.email agent@nextstate.dev
git config --global init.defaultBranch main
mkdir -p /app/service && cd /app/service
git init -q
commit() { git add -A && git commit -q -m "$1"; }

cat > config.py <<'PY'
"""Service configuration."""

HOST = "0.0.0.0"
PORT = 8000
TIMEOUT = 30
RETRIES = 0
LOG_LEVEL = "INFO"
PY
cat > client.py <<'PY'
"""Client for the upstream API."""
import config


def describe():
    return f"timeout={config.TIMEOUT}"
PY
printf '# Changelog\n\n## Unreleased\n\n## 1.0.0\n- First release\n' > CHANGELOG.md
printf '# Service\n' > README.md
commit "Initial service"

git checkout -q -b feature/retry
sed -i 's/^TIMEOUT = 30$/TIMEOUT = 45/; s/^RETRIES = 0$/RETRIES = 3/' config.py
cat > retry.py <<'PY'
"""Retry helper."""
import config


def attempts():
    return config.RETRIES + 1
PY
sed -i 's/^## Unreleased$/## Unreleased\n- Add retry support/' CHANGELOG.md
commit "Add retry support"
cat > client.py <<'PY'
"""Client for the upstream API."""
import config
import retry


def describe():
    return f"timeout={config.TIMEOUT} attempts={retry.attempts()}"
PY
commit "Use retries in client"

git checkout -q main
sed -i 's/^TIMEOUT = 30$/TIMEOUT = 60/' config.py
sed -i 's/^## Unreleased$/## Unreleased\n- Raise default timeout to 60s/' CHANGELOG.md
commit "Raise timeout"
printf '# Service\n\nListens on HOST:PORT from config.py.\n' > README.md
commit "Document HOST"
