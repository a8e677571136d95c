#!/bin/bash
set -euo pipefail
cd /app
rm -f events.db
sqlite3 events.db <<'SQL'
CREATE TABLE events (user_id TEXT, ts TEXT, event TEXT, amount REAL);
.mode csv
.import --skip 1 events.csv events
UPDATE events SET amount = NULL WHERE amount = '';
UPDATE events SET amount = CAST(amount AS REAL) WHERE amount IS NOT NULL;
SQL
python3 - <<'PY'
import json
import sqlite3
from datetime import datetime

con = sqlite3.connect("/app/events.db")
rows = con.execute("SELECT user_id, ts, event, amount FROM events ORDER BY user_id, ts").fetchall()
result = {}
for user in sorted({r[0] for r in rows}):
    mine = [r for r in rows if r[0] == user]
    times = [datetime.strptime(r[1], "%Y-%m-%dT%H:%M:%SZ").timestamp() for r in mine]
    sessions, longest, start = 1, 0, times[0]
    for prev, cur in zip(times, times[1:]):
        if cur - prev > 1800:
            sessions += 1
            start = cur
        longest = max(longest, cur - start)
    result[user] = {
        "sessions": sessions,
        "events": len(mine),
        "revenue": round(sum(r[3] for r in mine if r[2] == "purchase"), 2),
        "longest_session_seconds": int(longest),
    }
with open("/app/sessions.json", "w") as f:
    json.dump(result, f, indent=2)
PY
