"""The SWE-bench Lite table: build each row's image, grade gold and noop here and with swebench's own harness.

``python -m bench.swe_lite --tasks ROWS [--first-per-repo] [--ids A,B] [--repo-source DIR] [--no-harness] [--json]``

For each row, in the file's order: ``build-swe`` builds its image (:func:`envs.swe.images.build_swe`,
from ``--repo-source`` mirrors or GitHub); nextstate's grader (:func:`envs.swe.grading.grade`) grades the
row's gold ``patch`` and a noop patch (:data:`NOOP_PATCH`: one new file outside the code, since
swebench's harness skips an empty patch without grading it); then, unless ``--no-harness``, swebench's
own ``run_evaluation`` grades the same two patches on the row as ``export-swe`` writes it. A row
passes when gold resolves and noop does not, under both graders, and the two agree.
``--first-per-repo`` keeps each repository's first row in the file's order (the table's choice:
rows are never picked by whether they pass). One JSON object with ``--json``; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report

#: A patch that changes no code: it adds one file at the repository's root.
NOOP_PATCH = ("diff --git a/nextstate-noop.txt b/nextstate-noop.txt\nnew file mode 100644\n"
              "--- /dev/null\n+++ b/nextstate-noop.txt\n@@ -0,0 +1 @@\n+noop\n")
MODEL = "nextstate-swe-lite"


def first_per_repo(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each repository's first row, in the rows' order."""
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        seen.setdefault(row["repo"], row)
    return list(seen.values())


def harness_verdicts(row: dict[str, Any], patches: dict[str, str], *, timeout: int,
                     workdir: Path) -> dict[str, bool | str]:
    """swebench's ``run_evaluation`` on ``row`` (completed as ``export-swe`` writes it) for each named patch:
    ``resolved`` as a bool, or a string saying why the harness gave no report."""
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = workdir / "dataset.jsonl"
    dataset.write_text(json.dumps(row) + "\n")
    out: dict[str, bool | str] = {}
    for name, patch in patches.items():
        run_id = f"{MODEL}-{name}-{int(time.time())}"
        preds = workdir / f"preds-{name}.jsonl"
        preds.write_text(json.dumps({"instance_id": row["instance_id"], "model_name_or_path": MODEL,
                                     "model_patch": patch}) + "\n")
        ran = subprocess.run([sys.executable, "-m", "swebench.harness.run_evaluation", "-d", str(dataset),
                              "-p", str(preds), "-id", run_id, "--max_workers", "1", "-t", str(timeout),
                              "--report_dir", str(workdir)], cwd=workdir, capture_output=True, text=True)
        out[name] = read_harness_report(workdir, run_id, row["instance_id"], ran.stdout + ran.stderr)
    return out


def read_harness_report(workdir: Path, run_id: str, instance_id: str, output: str) -> bool | str:
    """``resolved`` from the harness's ``report.json`` for one instance, or why there is none."""
    path = workdir / "logs" / "run_evaluation" / run_id / MODEL / instance_id / "report.json"
    if not path.is_file():
        tail = " ".join(output.split()[-40:])
        return f"no harness report ({tail})"
    return bool(json.loads(path.read_text())[instance_id]["resolved"])


def verdict(gold: Any, noop: Any, network: bool = False) -> str:
    """``pass`` when gold resolves and noop does not; else what went wrong (``network``: a grade's log
    showed the tests reaching for a network they did not have)."""
    if gold is True and noop is False:
        return "pass"
    if not isinstance(gold, bool) or not isinstance(noop, bool):
        return "no grade"
    if network:
        return "tests need the internet"
    return "gold unresolved" if gold is not True else "noop resolved"


def measure_row(row: dict[str, Any], *, client: Any, repo_source: str | None, harness: bool,
                timeout: int) -> dict[str, Any]:
    """Build, then grade gold and noop here and (``harness``) with swebench's harness."""
    from nextstate.containers.protocol import SandboxError
    from nextstate.envs.swe.grading import grade, summary
    from nextstate.envs.swe.images import build_swe

    out: dict[str, Any] = {"instance_id": row["instance_id"], "repo": row["repo"], "version": row.get("version")}
    [built] = list(build_swe([row], client=client, repo_source=repo_source))
    out.update(build_s=round(built.seconds, 1), build_cached=built.cached, image_mib=round(built.size / 2**20))
    if built.error:
        out.update(result="build failed", reason=built.error[-600:])
        return out
    patches = {"gold": row["patch"], "noop": NOOP_PATCH}
    for name, patch in patches.items():
        try:
            graded = grade(row, patch, client=client, run_id="swe-lite", timeout=timeout)
            out[name] = graded.resolved
            out[f"{name}_s"] = graded.elapsed
            out[f"{name}_why"] = summary(graded)[:300]
            out[f"{name}_network_failure"] = graded.network_failure
        except SandboxError as e:
            out[name], out[f"{name}_why"] = None, str(e)[:300]
    out["result"] = verdict(out["gold"], out["noop"], bool(out.get("gold_network_failure")))
    if harness:
        with tempfile.TemporaryDirectory(prefix="nextstate-swe-lite-") as tmp:
            theirs = harness_verdicts(row, patches, timeout=timeout, workdir=Path(tmp))
        out["harness_gold"], out["harness_noop"] = theirs["gold"], theirs["noop"]
        out["harness_agrees"] = (theirs["gold"], theirs["noop"]) == (out["gold"], out["noop"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.swe_lite", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", required=True, help="rows in SWE-bench's schema (.jsonl, .json, .parquet)")
    ap.add_argument("--ids", help="comma-separated instance ids (default: every row)")
    ap.add_argument("--first-per-repo", action="store_true", help="each repository's first row in file order")
    ap.add_argument("--repo-source", help="local git mirrors, as build-swe --repo-source takes them")
    ap.add_argument("--no-harness", action="store_true", help="grade with nextstate's grader only")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds for one test run")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    from nextstate import containers
    from nextstate.envs.base import read_rows
    from nextstate.envs.swe.instances import load_instances
    from nextstate.envs.swe.specs import SpecError

    try:
        rows = read_rows(Path(args.tasks))
        rows = first_per_repo(rows) if args.first_per_repo else rows
        if args.ids:
            wanted = args.ids.split(",")
            unknown = sorted(set(wanted) - {r["instance_id"] for r in rows})
            if unknown:
                raise ValueError(f"unknown instance ids in {args.tasks}: {', '.join(unknown)}")
            rows = [r for r in rows if r["instance_id"] in wanted]
        rows = load_instances(rows)
    except (OSError, ValueError, KeyError) as e:
        print(f"bench.swe_lite: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    client = containers.connect()
    t0, table = time.monotonic(), []
    for row in rows:
        try:
            table.append(measure_row(row, client=client, repo_source=args.repo_source,
                                     harness=not args.no_harness, timeout=args.timeout))
        except SpecError as e:
            table.append({"instance_id": row["instance_id"], "repo": row["repo"], "result": "refused",
                          "reason": str(e)})
        print(json.dumps(table[-1]), file=sys.stderr, flush=True)
    report({"rows": table, "passed": sum(r["result"] == "pass" for r in table), "of": len(table),
            "harness_agrees": sum(bool(r.get("harness_agrees")) for r in table),
            "wall_s": round(time.monotonic() - t0, 1)}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
