"""``python -m envs validate FAMILY [--tasks PATH] [--parallel N]``: the oracle check.

FAMILY is a registered family, ``module:family`` (the module is imported first and
registers it), or the name of a module that registers a family of the same name.
"""

from __future__ import annotations

import argparse
import sys

from nextstate.envs import registry
from nextstate.envs.validate import summary, validate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envs", description="nextstate environments")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="run every task with its reference solution and with "
                           "doing nothing; exit 1 if any task is unsound")
    check.add_argument("family", help=f"{', '.join(registry.names())}; a family of your own: "
                       "MODULE:NAME (imports MODULE, which registers NAME), or NAME when its module is named NAME")
    check.add_argument("--tasks", help="task directory or file (default: the built-in set)")
    check.add_argument("--parallel", type=int, default=4, help="episodes at once (default 4)")
    check.add_argument("--backend", default="auto", choices=["auto", "docker", "local"],
                       help="sandbox backend (default: docker when available)")
    check.add_argument("--user", help="run every task as this user (default: the task's own; "
                       "root for terminal-bench and Harbor tasks)")
    args = parser.parse_args(argv)
    try:
        checks = validate(registry.resolve(args.family), args.tasks, parallel=args.parallel, backend=args.backend,
                          env_kwargs={"user": args.user} if args.user else None)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(summary(checks))
    return 1 if not checks or not all(c.ok for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
