"""The file editor of the SWE environment; it runs inside the sandbox, never on the host.

:class:`envs.swe.SWEEnv` sends this file's source to ``python3 -c`` with the
call's arguments as JSON on stdin. It prints what the model sees and exits 0,
or 1 when it refused (the file is then unchanged). Standard library only, and
Python 3.6+ syntax, as task images ship old interpreters.

Commands: ``view`` (a file with line numbers, optionally ``view_range``, or a
directory two levels deep), ``create``, ``str_replace`` (``old_str`` must
occur exactly once), ``insert`` (``new_str`` after line ``insert_line``, 0 for
the top) and ``undo_edit`` (the last edit of that file). Earlier contents are
kept under ``/tmp/.nextstate-editor`` for ``undo_edit``.
"""

import hashlib
import json
import os
import sys

HISTORY_DIR = "/tmp/.nextstate-editor"
HISTORY_DEPTH = 10
SNIPPET_LINES = 4


class Refused(Exception):
    """The call cannot be done; the message says why."""


def numbered(lines, first=1):
    """Lines with right-aligned numbers, as ``cat -n`` shows them."""
    return "\n".join("%6d\t%s" % (first + i, line) for i, line in enumerate(lines))


def split_lines(text):
    """The lines of ``text``; a final newline ends the last line instead of starting an empty one."""
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def read_text(path):
    if not os.path.exists(path):
        raise Refused("The path %s does not exist." % path)
    if os.path.isdir(path):
        raise Refused("%s is a directory; only view works on directories." % path)
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except UnicodeDecodeError:
        raise Refused("%s is not a UTF-8 text file." % path) from None


def write_text(path, text):
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def history_file(path):
    return os.path.join(HISTORY_DIR, hashlib.sha1(path.encode()).hexdigest() + ".json")


def load_history(path):
    try:
        with open(history_file(path), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def save_history(path, history):
    os.makedirs(HISTORY_DIR, exist_ok=True)
    with open(history_file(path), "w", encoding="utf-8") as f:
        json.dump(history[-HISTORY_DEPTH:], f)


def remember(path):
    """Records the current content of ``path`` (None: absent) before an edit."""
    before = read_text(path) if os.path.isfile(path) else None
    save_history(path, load_history(path) + [before])


def snippet(path, text, line):
    """The lines around ``line`` (1-based) after an edit."""
    lines = split_lines(text)
    start = max(1, line - SNIPPET_LINES)
    end = min(len(lines), line + SNIPPET_LINES)
    return ("The file %s has been edited. Here is the result of running `cat -n` on a snippet of it:\n%s\n"
            "Review the changes and edit the file again if they are not as intended."
            % (path, numbered(lines[start - 1:end], start)))


def view(path, view_range):
    if os.path.isdir(path):
        if view_range:
            raise Refused("view_range only applies to files, and %s is a directory." % path)
        found = []
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(root, name)
                      for name in dirs + sorted(f for f in files if not f.startswith("."))]
            if root != path:
                dirs[:] = []
        return ("Files and directories up to 2 levels deep in %s, hidden items excluded:\n%s"
                % (path, "\n".join(sorted(found))))
    lines = split_lines(read_text(path))
    first, last = 1, len(lines)
    if view_range:
        if len(view_range) != 2 or not all(isinstance(n, int) for n in view_range):
            raise Refused("view_range must be two integers [start, end]; end -1 means the last line.")
        first, last = view_range
        if last == -1:
            last = len(lines)
        if not 1 <= first <= len(lines) or not first <= last <= len(lines):
            raise Refused("view_range %s is outside the file, whose lines are 1 to %d."
                          % (view_range, len(lines)))
    return "Here is the result of running `cat -n` on %s:\n%s" % (path, numbered(lines[first - 1:last], first))


def create(path, file_text):
    if os.path.isdir(path):
        raise Refused("%s is a directory." % path)
    existed = os.path.exists(path)
    remember(path)
    write_text(path, file_text)
    return "File %s: %s." % ("overwritten" if existed else "created", path)


def str_replace(path, old_str, new_str):
    text = read_text(path)
    if not old_str:
        raise Refused("old_str must not be empty; use insert or create to add text.")
    count = text.count(old_str)
    if count == 0:
        raise Refused("No replacement was performed: old_str does not occur verbatim in %s. "
                      "Check whitespace and indentation (view the file first)." % path)
    if count > 1:
        starts, at = [], text.find(old_str)
        while at >= 0:
            starts.append(str(text.count("\n", 0, at) + 1))
            at = text.find(old_str, at + 1)
        raise Refused("No replacement was performed: old_str occurs %d times in %s (starting on lines %s). "
                      "Include more surrounding lines so that it is unique." % (count, path, ", ".join(starts)))
    remember(path)
    at = text.index(old_str)
    write_text(path, text.replace(old_str, new_str, 1))
    line = text.count("\n", 0, at) + 1 + new_str.count("\n") // 2
    return snippet(path, text.replace(old_str, new_str, 1), line)


def insert(path, insert_line, new_str):
    text = read_text(path)
    lines = split_lines(text)
    if not 0 <= insert_line <= len(lines):
        raise Refused("insert_line %d is outside the file: it must be between 0 and %d."
                      % (insert_line, len(lines)))
    remember(path)
    updated = "\n".join(lines[:insert_line] + split_lines(new_str) + lines[insert_line:])
    if text.endswith("\n") or not text:
        updated += "\n"
    write_text(path, updated)
    return snippet(path, updated, insert_line + 1)


def undo_edit(path):
    history = load_history(path)
    if not history:
        raise Refused("There is no edit of %s to undo." % path)
    before = history.pop()
    save_history(path, history)
    if before is None:
        os.remove(path)
        return "Undid the creation of %s (the file is removed)." % path
    write_text(path, before)
    return "Undid the last edit of %s." % path


def run(args):
    path = args.get("path") or ""
    if not path:
        raise Refused("path is required.")
    path = os.path.normpath(os.path.join(args.get("root") or "/", path))
    command = args.get("command")

    def need(name):
        if args.get(name) is None:
            raise Refused("%s is required for the %s command." % (name, command))
        return args[name]

    if command == "view":
        return view(path, args.get("view_range"))
    if command == "create":
        return create(path, need("file_text"))
    if command == "str_replace":
        return str_replace(path, need("old_str"), args.get("new_str") or "")
    if command == "insert":
        return insert(path, need("insert_line"), need("new_str"))
    if command == "undo_edit":
        return undo_edit(path)
    raise Refused("Unknown command %r; use view, create, str_replace, insert or undo_edit." % command)


def main():
    try:
        print(run(json.loads(sys.stdin.read())))
    except Refused as e:
        print(e)
        sys.exit(1)
    except OSError as e:
        print("Error: %s" % e)
        sys.exit(1)


if __name__ == "__main__":
    main()
