#!/bin/bash
set -euo pipefail
cd /app/repo
deleted_in=$(git log --diff-filter=D --format=%H -n 1 -- config/settings.yaml)
git checkout "${deleted_in}^" -- config/settings.yaml
git commit -q -m "Restore settings.yaml"
