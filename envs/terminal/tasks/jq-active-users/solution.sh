#!/bin/bash
set -euo pipefail
cd /app
jq -r '.users[] | select(.active == true and .age >= 30) | .name' users.json | sort > active_names.txt
jq '[.users[] | select(any(.roles[]; . == "admin")) | .email]' users.json > admins.json
