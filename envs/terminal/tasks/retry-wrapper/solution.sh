#!/bin/bash
set -euo pipefail
mkdir -p /app/bin
cat > /app/bin/retry <<'SCRIPT'
#!/bin/bash
# retry [-n ATTEMPTS] [-d DELAY] -- COMMAND [ARG...]
usage() {
    echo "retry: $1" >&2
    echo "usage: retry [-n ATTEMPTS] [-d DELAY] -- COMMAND [ARG...]" >&2
    exit 64
}

attempts=3
delay=1
while [ $# -gt 0 ]; do
    case "$1" in
        -n) [ $# -ge 2 ] || usage "-n needs a value"; attempts=$2; shift 2 ;;
        -d) [ $# -ge 2 ] || usage "-d needs a value"; delay=$2; shift 2 ;;
        --) shift; break ;;
        *) usage "unknown argument: $1" ;;
    esac
done
[[ "$attempts" =~ ^[0-9]+$ ]] && [ "$attempts" -gt 0 ] || usage "ATTEMPTS must be a positive integer"
[[ "$delay" =~ ^[0-9]*\.?[0-9]+$ ]] || usage "DELAY must be a number of seconds"
[ $# -gt 0 ] || usage "missing command after --"

for ((k = 1; k <= attempts; k++)); do
    status=0
    "$@" || status=$?
    [ "$status" -eq 0 ] && exit 0
    echo "retry: attempt $k/$attempts failed with exit code $status" >&2
    [ "$k" -lt "$attempts" ] && sleep "$delay"
done
exit "$status"
SCRIPT
chmod 755 /app/bin/retry
