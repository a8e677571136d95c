#!/bin/bash
set -euo pipefail
cd /app/project
git init -q -b main
printf '*.log\nbuild/\n.env\n' > .gitignore
git add -A
git commit -q -m "Initial commit"
