"""The SWE file editor script, run as the sandbox runs it (JSON on stdin), here on a scratch directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import nextstate.envs.swe.editor as editor

SOURCE = Path(editor.__file__).read_text()


@pytest.fixture
def edit(tmp_path, monkeypatch):
    monkeypatch.setattr(editor, "HISTORY_DIR", str(tmp_path / "history"))
    root = tmp_path / "repo"
    root.mkdir()
    (root / "mod.py").write_text("a = 1\nb = 2\na = 1\n")

    def call(**args):
        args.setdefault("root", str(root))
        try:
            return 0, editor.run(args)
        except editor.Refused as e:
            return 1, str(e)
    call.root = root
    return call


def test_view_numbers_lines_and_honours_view_range(edit):
    rc, out = edit(command="view", path="mod.py")
    assert rc == 0 and "     1\ta = 1\n     2\tb = 2\n     3\ta = 1" in out
    rc, out = edit(command="view", path="mod.py", view_range=[2, -1])
    assert rc == 0 and "     2\tb = 2" in out and "     1\t" not in out
    rc, out = edit(command="view", path="mod.py", view_range=[2, 9])
    assert rc == 1 and "lines are 1 to 3" in out


def test_view_of_a_directory_lists_two_levels(edit):
    (edit.root / "pkg" / "sub" / "deep").mkdir(parents=True)
    (edit.root / "pkg" / "sub" / "deep" / "x.py").write_text("")
    (edit.root / ".git").mkdir()
    rc, out = edit(command="view", path=".")
    assert rc == 0
    assert f"{edit.root}/pkg/sub\n" in out + "\n" and "/deep" not in out and ".git" not in out


def test_str_replace_refuses_missing_and_ambiguous_matches(edit):
    rc, out = edit(command="str_replace", path="mod.py", old_str="zzz", new_str="y")
    assert rc == 1 and "does not occur verbatim" in out
    rc, out = edit(command="str_replace", path="mod.py", old_str="a = 1", new_str="y")
    assert rc == 1 and "occurs 2 times" in out and "lines 1, 3" in out
    assert (edit.root / "mod.py").read_text() == "a = 1\nb = 2\na = 1\n"


def test_str_replace_insert_and_undo(edit):
    rc, out = edit(command="str_replace", path="mod.py", old_str="b = 2\n", new_str="b = 3\n")
    assert rc == 0 and "     2\tb = 3" in out
    rc, _ = edit(command="insert", path=str(edit.root / "mod.py"), insert_line=0, new_str="# top")
    assert rc == 0
    assert (edit.root / "mod.py").read_text() == "# top\na = 1\nb = 3\na = 1\n"
    rc, out = edit(command="insert", path="mod.py", insert_line=9, new_str="x")
    assert rc == 1 and "between 0 and 4" in out
    assert edit(command="undo_edit", path="mod.py")[0] == 0
    assert (edit.root / "mod.py").read_text() == "a = 1\nb = 3\na = 1\n"
    assert edit(command="undo_edit", path="mod.py")[0] == 0
    assert (edit.root / "mod.py").read_text() == "a = 1\nb = 2\na = 1\n"
    rc, out = edit(command="undo_edit", path="mod.py")
    assert rc == 1 and "no edit" in out


def test_create_and_undo_removes_the_new_file(edit):
    rc, _ = edit(command="create", path="pkg/new.py", file_text="x = 1\n")
    assert rc == 0 and (edit.root / "pkg/new.py").read_text() == "x = 1\n"
    assert edit(command="undo_edit", path="pkg/new.py")[0] == 0
    assert not (edit.root / "pkg/new.py").exists()
    rc, out = edit(command="create", path="other.py")
    assert rc == 1 and "file_text is required" in out


def test_script_reads_json_on_stdin_and_exits_1_on_refusal(tmp_path):
    (tmp_path / "f.txt").write_text("hello\n")
    args = {"command": "str_replace", "path": "f.txt", "root": str(tmp_path), "old_str": "nope", "new_str": ""}
    done = subprocess.run([sys.executable, "-I", "-S", "-c", SOURCE], input=json.dumps(args),
                          capture_output=True, text=True)
    assert done.returncode == 1 and "does not occur verbatim" in done.stdout
