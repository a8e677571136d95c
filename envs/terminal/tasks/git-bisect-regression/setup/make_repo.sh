#!/bin/bash
# Builds /app/calc: 24 commits; the one titled "Simplify percentage helper" breaks ./check.sh.
set -euo pipefail
git config --global user.name "Agent"
git config --global user.email agent@nextstate.dev
git config --global init.defaultBranch main
mkdir -p /app/calc && cd /app/calc
git init -q
commit() { git add -A && git commit -q -m "$1"; }

cat > calc.py <<'PY'
"""Small arithmetic helpers."""


def add(a, b):
    return a + b


def percent(part, whole):
    """Share of `part` in `whole`, in percent."""
    return part / whole * 100
PY
cat > check.sh <<'SH'
#!/bin/sh
# Exits 0 when the helpers behave.
cd "$(dirname "$0")" && python3 -B -c '
import calc
assert calc.add(2, 3) == 5
assert calc.percent(1, 4) == 25.0
assert calc.percent(3, 8) == 37.5
'
SH
chmod 755 check.sh
printf 'Release notes\n' > NOTES.txt
commit "Add calc helpers and check script"

for i in $(seq 2 24); do
    case $i in
        9)  printf '\n\ndef sub(a, b):\n    return a - b\n' >> calc.py
            commit "Add sub helper" ;;
        14) sed -i 's|    return part / whole \* 100|    return part * 100 // whole|' calc.py
            commit "Simplify percentage helper" ;;
        19) printf '\n\ndef mul(a, b):\n    return a * b\n' >> calc.py
            commit "Add mul helper" ;;
        *)  printf 'note %s\n' "$i" >> NOTES.txt
            commit "Update release notes ($i)" ;;
    esac
done
