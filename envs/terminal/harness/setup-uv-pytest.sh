# nextstate's setup-uv-pytest.sh, put in $TEST_DIR (as terminal-bench's harness puts its own) when a
# task's run-tests.sh names it; run-tests.sh sources it. terminal-bench's fetches curl and uv from the
# internet and starts a uv project with pytest in the working directory. This one downloads nothing:
# it puts nextstate's offline `uv` (uv next to this file) first on PATH, which runs the task's
# `uv add` / `uv run` on the image's own python3 and pytest.
if [ "$PWD" = "/" ]; then  # as terminal-bench's: a task image needs a WORKDIR
    echo "setup-uv-pytest.sh: the working directory is /; the task's Dockerfile sets no WORKDIR" >&2
    exit 1
fi
export PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.nextstate-uv:$PATH"
uv add pytest
