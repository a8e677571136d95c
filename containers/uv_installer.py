"""astral.sh's uv installer in a Dockerfile, served from the package registry where astral.sh is not reachable.

Many task Dockerfiles install uv with ``curl -LsSf https://astral.sh/uv/<version>/install.sh | sh``
(every SWE-bench task terminal-bench adapted does). Where the host cannot reach astral.sh but the
package registry answers, that pipe is replaced (:func:`offline_uv`) by a script
(``uv-install.sh``) that installs the same uv from its wheel on the registry, downloaded on the host
(:func:`uv_wheel_binaries`): ``uv`` and ``uvx`` go where the installer puts them
(``$UV_INSTALL_DIR``, else ``$XDG_BIN_HOME``, else ``$HOME/.local/bin``) with the ``env`` file that puts
that folder on ``PATH``, sourced from ``~/.profile`` and ``~/.bashrc``. The binaries are those of the
registry's ``manylinux`` x86_64 wheel: they need glibc (not Alpine's musl) and this host's architecture.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

#: The installer piped into a shell: ``curl ... https://astral.sh/uv[/VERSION]/install.sh | sh`` (or wget, bash).
INSTALLER = re.compile(r"\b(?:curl|wget)\b[^|;&\n]*?https?://astral\.sh/uv/(?:(\d[\w.+-]*)/)?install\.sh"
                       r"[^|;&\n]*\|\s*((?:env\s+(?:\w+=\S*\s+)*)?)(?:sh|bash)\b")
CONTEXT_NAME = "nextstate-uv"           # the folder of the build context that holds the binaries and script
IN_IMAGE = "/usr/local/share/nextstate/uv"
SCRIPT = Path(__file__).resolve().parent / "uv-install.sh"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "nextstate" / "uv"


@functools.cache
def astral_answers() -> bool:
    """Whether astral.sh answers from here (asked once per process)."""
    try:
        with urllib.request.urlopen(urllib.request.Request("https://astral.sh/uv/install.sh", method="HEAD"),
                                    timeout=10):
            return True
    except (OSError, ValueError):
        return False


def offline_uv(text: str) -> tuple[str, str | None]:
    """A Dockerfile's text with each astral.sh installer pipe replaced by nextstate's offline one (a
    ``COPY`` of :data:`CONTEXT_NAME` before each instruction that pipes it), and the uv version it asks
    for (``""``: the newest); ``(text, None)`` where no instruction pipes it."""
    out, versions, instruction = [], set(), []
    for line in [*text.splitlines(keepends=True), ""]:
        instruction.append(line)
        if line and line.rstrip("\r\n").endswith("\\"):
            continue  # the instruction goes on
        block, instruction = "".join(instruction), []
        found = [] if block.lstrip().startswith("#") else list(INSTALLER.finditer(block))
        if found:
            versions |= {m.group(1) or "" for m in found}
            out.append(f"COPY {CONTEXT_NAME} {IN_IMAGE}\n")
            block = INSTALLER.sub(lambda m: f"{m.group(2)}sh {IN_IMAGE}/uv-install.sh", block)
        out.append(block)
    if len(versions) > 1:
        raise ValueError(f"the Dockerfile installs several uv versions ({', '.join(sorted(versions))}); "
                         "astral.sh is not reachable, and one offline uv serves one version")
    return ("".join(out), versions.pop()) if versions else (text, None)


def uv_wheel_binaries(version: str, folder: Path) -> None:
    """Puts ``uv``, ``uvx`` (from the registry's wheel of uv ``version``, ``""``: the newest; downloaded
    on this host once and cached) and ``uv-install.sh`` into ``folder``."""
    cached = CACHE / (version or "newest")
    if not (cached / "uv").is_file() or not version:
        with tempfile.TemporaryDirectory(prefix="nextstate-uv-") as scratch:
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--dest", scratch, f"uv=={version}" if version else "uv"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            wheels = list(Path(scratch).glob("uv-*.whl"))
            if done.returncode or not wheels:
                why = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
                raise RuntimeError(f"astral.sh is not reachable and the package registry has no uv "
                                   f"{version or ''} wheel for this host: {why}")
            cached.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheels[0]) as wheel:
                for name in ("uv", "uvx"):
                    member = next(n for n in wheel.namelist() if n.endswith(f".data/scripts/{name}"))
                    (cached / name).write_bytes(wheel.read(member))
                    (cached / name).chmod(0o755)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("uv", "uvx"):
        shutil.copy(cached / name, folder / name)
    shutil.copy(SCRIPT, folder / SCRIPT.name)
    (folder / SCRIPT.name).chmod(stat.S_IRWXU | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
