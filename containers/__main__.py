"""Command line: `python -m containers [--host URL] {build,reap,list,...}`.

Packages above the runtime add subcommands through the ``nextstate.containers`` entry-point
group (a function that takes the subparsers object): the SWE family adds ``build-swe``
(:func:`envs.swe.images.add_command`), so this package never imports an env.
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import entry_points

from nextstate.containers.build import Progress, build_all, known_images
from nextstate.containers.disks import reap_disks
from nextstate.containers.engine import HOST_LABEL, PID_LABEL, ROLE_LABEL, RUN_LABEL, connect, owner_alive
from nextstate.containers.reap import project_containers, reap

COMMANDS = "nextstate.containers"


def cmd_build(args: argparse.Namespace) -> int:
    """Builds the named images (default: all), saying which were cache hits."""
    client = connect(args.host)
    start = time.monotonic()
    for built in build_all(args.names or None, client=client, force=args.force):
        state = "up to date" if built.cached else "built"
        print(f"{built.tag}: {state} ({built.image_id[7:19]})", flush=True)
    print(f"done in {time.monotonic() - start:.1f}s")
    return 0


def cmd_reap(args: argparse.Namespace) -> int:
    """Removes leftover containers and prints how many."""
    count = reap(connect(args.host), all_hosts=args.all_hosts, run_id=args.run_id, disks=False)
    disks = reap_disks(all_hosts=args.all_hosts, run_id=args.run_id)
    print(f"removed {count} container{'s' * (count != 1)}" + (f" and {disks} disk{'s' * (disks != 1)}" if disks else ""))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Prints project containers with their owner labels and whether the owner lives."""
    rows = [("ID", "NAME", "STATE", "RUN", "ROLE", "HOST", "PID", "OWNER")]
    for info in project_containers(connect(args.host)):
        labels = info.get("Labels") or {}
        alive = owner_alive(labels)
        rows.append((
            info["Id"][:12], (info.get("Names") or ["?"])[0].lstrip("/"), info.get("State", "?"),
            labels.get(RUN_LABEL, "-"), labels.get(ROLE_LABEL, "-"), labels.get(HOST_LABEL, "-"),
            labels.get(PID_LABEL, "-"), {True: "alive", False: "dead", None: "other host"}[alive],
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_tag_stand_ins(args: argparse.Namespace) -> int:
    """Tags the stand-ins of the named public images under those names, a line each."""
    from nextstate.containers.stand_ins import tag_stand_ins

    for name, tag, what in tag_stand_ins(connect(args.host), args.names, force=args.force):
        print(f"{name}: {what} ({tag})", flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    """The argument parser."""
    top = argparse.ArgumentParser(prog="python -m containers", description=__doc__)
    top.add_argument("--host", help="Docker engine URL (default: DOCKER_HOST or the local socket)")
    sub = top.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build images (offline via debootstrap when no registry answers; "
                       "NEXTSTATE_OFFLINE=1/0 forces)")
    b.add_argument("names", nargs="*", metavar="NAME", help=f"images (default: all: {', '.join(known_images())})")
    b.add_argument("--force", action="store_true", help="rebuild even when up to date")
    b.set_defaults(func=cmd_build)
    for command in entry_points(group=COMMANDS):   # subcommands that packages above the runtime add
        command.load()(sub)
    t = sub.add_parser("tag-stand-ins", help="tag the offline stand-ins of public base images under their "
                       "names (ubuntu:24.04, python:3.12-slim, ...), so tools that build FROM them work here")
    t.add_argument("names", nargs="+", metavar="NAME", help="public image names with their tags")
    t.add_argument("--force", action="store_true", help="replace a name the engine already holds")
    t.set_defaults(func=cmd_tag_stand_ins)
    r = sub.add_parser("reap", help="remove containers whose owner process is gone")
    r.add_argument("--all-hosts", action="store_true", help="also remove containers owned by other hosts")
    r.add_argument("--run-id", help="remove this run's containers, whether or not their owner lives")
    r.set_defaults(func=cmd_reap)
    sub.add_parser("list", help="show project containers and their owners").set_defaults(func=cmd_list)
    return top


def main(argv: list[str] | None = None) -> int:
    """Entry point; errors print as one line and exit 1."""
    args = parser().parse_args(argv)
    Progress.log_lines = True   # a build log here, not one line per image redrawn in place
    try:
        return args.func(args)
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
