#!/bin/bash
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/greet <<'SCRIPT'
#!/bin/bash
upper=0
if [ "${1:-}" = "-u" ]; then
    upper=1
    shift
fi
name="${*:-world}"
message="Hello, ${name}!"
if [ "$upper" = 1 ]; then
    message="${message^^}"
fi
printf '%s\n' "$message"
SCRIPT
chmod 755 /app/bin/greet
