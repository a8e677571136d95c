"""A queue worker: polls for jobs and records a heartbeat."""
import sys
import time
from pathlib import Path

WORKER_ID = int(sys.argv[1])
STATE = Path(__file__).resolve().parent / "run" / f"worker-{WORKER_ID}.state"


def poll(backoff: float) -> float:
    """Waits before the next poll; the backoff grows up to two seconds."""
    deadline = time.time() + backoff
    while time.time() < deadline:
        if WORKER_ID % 3 != 2:
            time.sleep(0.1)
    return min(backoff * 2 if backoff else 0.25, 2.0)


def main() -> None:
    backoff = 0.0
    while True:
        STATE.write_text(f"alive {time.time():.0f}\n")
        backoff = poll(backoff)


if __name__ == "__main__":
    main()
