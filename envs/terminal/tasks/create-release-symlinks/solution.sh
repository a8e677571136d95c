#!/bin/bash
set -euo pipefail
cd /app
ln -sfn releases/v2.0 current
ln -sfn releases/v1.1 previous
mkdir -p bin
ln -sfn ../current/bin/app bin/app
