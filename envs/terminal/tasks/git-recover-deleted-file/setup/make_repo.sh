#!/bin/bash
# Builds /app/repo: a history in which config/settings.yaml is edited, then deleted.
set -euo pipefail
git config --global user.name "Agent"
git config --global user.email agent@nextstate.dev
git config --global init.defaultBranch main
mkdir -p /app/repo && cd /app/repo
git init -q
commit() { git add -A && git commit -q -m "$1"; }

printf '# Billing service\n' > README.md
mkdir -p config
printf 'database:\n  host: localhost\n  port: 5432\nfeatures:\n  invoices: true\n' > config/settings.yaml
commit "Add README and settings"

printf 'database:\n  host: db.internal\n  port: 5432\n  pool: 10\nfeatures:\n  invoices: true\n  refunds: true\n' > config/settings.yaml
commit "Tune database settings"

printf 'import yaml\n\nSETTINGS = "config/settings.yaml"\n' > app.py
commit "Add app entry point"

printf 'database:\n  host: db.internal\n  port: 6543\n  pool: 10\nfeatures:\n  invoices: false\n  refunds: true\n' > config/settings.yaml
commit "Try pgbouncer port"

git rm -q config/settings.yaml
printf 'import os\n\nSETTINGS = os.environ.get("SETTINGS", "config/settings.yaml")\n' > app.py
commit "Move settings to environment"

printf '# Billing service\n\nRun with SETTINGS=path/to/settings.yaml.\n' > README.md
commit "Document SETTINGS variable"
