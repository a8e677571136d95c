"""README.md and docs/*.md cannot go stale: their runnable code blocks run, their links resolve.

A block is runnable when the line before its fence is ``<!-- runnable -->`` (invisible on
GitHub); ``<!-- runnable file=NAME -->`` saves the block as NAME instead of running it, for
the blocks after it to use. A page's blocks run in order, as a reader would type them, in one
fresh working directory that holds links to the checkout's top-level entries, so relative
paths (``tests/fixtures/...``) work, the checkout's packages are the ones imported, and what a
block writes (``runs/``, ``count.py``) stays out of the checkout. Python blocks run in a fresh
interpreter, bash blocks with ``bash -euo pipefail``. They need Docker, so they skip without
an engine (see conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!--\s*runnable(?:\s+file=(\S+))?\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BLOCK_TIMEOUT_S = 900


@dataclass
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    file: str | None   # save as this file instead of running


def code_blocks(page: Path) -> list[Block]:
    """The runnable blocks of ``page``, in order; a marker not followed by a fence is an error."""
    lines = page.read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        mark = MARK.match(line)
        if not mark:
            continue
        fence = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        if not fence or fence.group(1) not in ("python", "bash"):
            raise ValueError(f"{page.name}:{i + 1}: a runnable marker must come right before a "
                             "```python or ```bash fence")
        end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
        blocks.append(Block(page, i + 2, fence.group(1), "\n".join(lines[i + 2:end]) + "\n", mark.group(1)))
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (outside code blocks and code spans)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


RUNNABLE = [p for p in PAGES if code_blocks(p)]
SLOW = {"verl.md"}   # over a minute: importing veRL to compose its config


def test_the_guides_exist_and_have_runnable_blocks():
    names = {p.name for p in PAGES}
    assert {"README.md", "adding-an-environment.md", "sandboxes-and-pool.md", "environments.md"} <= names
    assert ROOT / "docs" / "adding-an-environment.md" in RUNNABLE
    assert len([b for p in RUNNABLE for b in code_blocks(p) if b.file is None]) >= 8


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_point_to_files_and_headings_that_exist(page: Path):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory that looks like the checkout (links to its entries) but keeps what is written."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "runs") and not entry.name.startswith((".pytest", "__pycache__")):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


@pytest.mark.docker
@pytest.mark.timeout(3 * BLOCK_TIMEOUT_S)
@pytest.mark.parametrize("page", [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in SLOW else [])
                                  for p in RUNNABLE])
def test_runnable_blocks_run(page: Path, workdir: Path):
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    for block in code_blocks(page):
        if block.file:
            (workdir / block.file).write_text(block.code)
            continue
        cmd = [sys.executable, "-c", block.code] if block.lang == "python" else ["bash", "-euo", "pipefail", "-c", block.code]
        out = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert out.returncode == 0, (f"{page.name}:{block.line}: the {block.lang} block exited {out.returncode}\n"
                                     f"{block.code}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}")
