"""``python -m viewer RUN_DIR``: a page on 127.0.0.1 to read a run step by step.

    python -m viewer runs/terminal                    # serves http://127.0.0.1:8765
    python -m viewer runs/eval --port 9000
    python -m viewer runs/terminal --export run.html  # one self-contained page to share
    python -m viewer runs/terminal --export-atif      # ATIF trajectories (Harbor's format) in runs/terminal/atif

Works on the output folder of ``python -m train`` (``rollouts.jsonl``, or one
``rollouts.<host>.<pid>.jsonl`` per agent-loop worker of a veRL run, read together in time order,
``advantages.jsonl``, ``metrics.jsonl``, ``config.json``) and of
``python -m train.evaluate`` (``results.jsonl``, ``report.json``, and
``rollouts.jsonl`` when it wrote one). The page shows the run's curves
(held-out success first; steps that trained nothing are gaps), config and
counts; a filterable episode list (training and held-out episodes, success
or failure apart from how the episode ended); each episode step by step (the
grader's details, the messages the policy saw, action, next state, the
judge's prompt, answers and votes, ``R_t`` and the advantage the step was
trained with, screenshots before and after); and the group view, the n
samples of one task aligned by step index. It follows a run in progress (the page polls; the server reads
only the bytes appended since the last poll).
"""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser

from nextstate.viewer.atif import export_atif
from nextstate.viewer.index import RunIndex
from nextstate.viewer.server import export, make_server


def main(argv: list[str] | None = None) -> int:
    """Serve the page of a run folder (or write it with ``--export``); returns the exit code."""
    p = argparse.ArgumentParser(prog="python -m viewer", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("run", help="run folder of `python -m train` or `python -m train.evaluate`")
    p.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (default 8765; 0 picks one)")
    p.add_argument("--export", metavar="FILE.html", help="write one self-contained page instead of serving")
    p.add_argument("--open", action="store_true", help="open the page in a browser")
    p.add_argument("--export-atif", action="store_true",
                   help="write each episode as an ATIF trajectory (Harbor's format) instead of serving")
    p.add_argument("--out", metavar="DIR", help="folder for --export-atif (default RUN/atif)")
    args = p.parse_args(argv)
    try:
        if args.export_atif:
            files, skipped = export_atif(args.run, args.out)
            left = f"; {len(skipped)} without recorded steps left out" if skipped else ""
            where = files[0].parent if files else (args.out or f"{args.run}/atif")
            print(f"wrote {len(files)} ATIF trajectories to {where}{left}")
            return 0 if files else 1
        index = RunIndex(args.run)
        if args.export:
            dest = export(index, args.export)
            n = len(index.overview()["episodes"])
            print(f"wrote {dest} ({dest.stat().st_size / 1e6:.1f} MB, {n} episodes)")
            return 0
        index.refresh()
        server = make_server(index, args.port)
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    print(f"serving {args.run} at {url} (Ctrl-C to stop)", flush=True)
    if args.open:
        threading.Timer(0.5, webbrowser.open, [url]).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
