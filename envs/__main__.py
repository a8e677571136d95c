"""``python -m envs validate FAMILY [--tasks PATH] [--parallel N]``: the oracle check;
``python -m envs serve FAMILY [--port P] [--max-sessions N]``: the family over OpenEnv's API
(:mod:`envs.openenv`);
``python -m envs export-harbor terminal --out DIR [--tasks PATH]``: terminal tasks as Harbor task
directories (:mod:`envs.terminal.harbor_export`).

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
    serve = sub.add_parser("serve", help="serve a family over OpenEnv's HTTP and WebSocket API")
    serve.add_argument("family", help="a registered family, or MODULE:NAME")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--max-sessions", type=int, default=8,
                       help="WebSocket sessions at once, each with its own sandbox (default 8)")
    serve.add_argument("--tasks", help="task directory or file (default: the built-in set)")
    serve.add_argument("--backend", default="auto", choices=["auto", "docker", "local"],
                       help="sandbox backend (default: docker when available)")
    serve.add_argument("--max-steps", type=int, help="steps before truncation (default: the family's)")
    harbor = sub.add_parser("export-harbor", help="write a family's tasks as Harbor task directories")
    harbor.add_argument("family", help="terminal (the family whose tasks Harbor's format holds)")
    harbor.add_argument("--out", required=True, help="folder for the task directories")
    harbor.add_argument("--tasks", help="task directory or file, or procedural:START:COUNT (default: the built-in set)")
    harbor.add_argument("--ids", help="comma-separated task ids to write (default all)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return run_server(args)
    if args.command == "export-harbor":
        return export_harbor(args)
    try:
        checks = validate(registry.resolve(args.family), args.tasks, parallel=args.parallel, backend=args.backend,
                          env_kwargs={"user": args.user} if args.user else None)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(summary(checks))
    return 1 if not checks or not all(c.ok for c in checks) else 0


def export_harbor(args: argparse.Namespace) -> int:
    """``python -m envs export-harbor``: write the tasks, one line per run."""
    from nextstate.envs.terminal import TerminalEnv
    from nextstate.envs.terminal.harbor_export import export_tasks

    if args.family != "terminal":
        print(f"error: export-harbor writes terminal tasks only, not {args.family!r}", file=sys.stderr)
        return 1
    try:
        tasks, broken = TerminalEnv.load_task_set(args.tasks)
        if args.ids:
            wanted = set(args.ids.split(","))
            missing = wanted - {t.id for t in tasks}
            if missing:
                raise ValueError(f"no task {', '.join(sorted(missing))} in {args.tasks or 'the built-in set'}")
            tasks = [t for t in tasks if t.id in wanted]
        written = export_tasks(tasks, args.out)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    left = f"; {len(broken)} could not be read ({broken[0][0]}: {broken[0][1]})" if broken else ""
    print(f"wrote {len(written)} Harbor tasks to {args.out}{left}")
    return 0


def run_server(args: argparse.Namespace) -> int:
    """``python -m envs serve``: serve until interrupted, then close the sandboxes."""
    try:
        import uvicorn

        from nextstate.envs.openenv import FamilyServer
    except ImportError as e:
        print(f"error: serving needs openenv-core and uvicorn ({e}): pip install 'nextstate[openenv]'",
              file=sys.stderr)
        return 1
    try:
        server = FamilyServer(args.family, tasks=args.tasks, max_sessions=args.max_sessions, backend=args.backend,
                              **({"max_steps": args.max_steps} if args.max_steps else {}))
    except (OSError, ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        print(f"serving {server.family} ({len(server.tasks)} tasks) over OpenEnv at http://{args.host}:{args.port} "
              f"(WebSocket /ws, at most {args.max_sessions} sessions)", flush=True)
        uvicorn.run(server.app(), host=args.host, port=args.port, log_level="warning")
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
