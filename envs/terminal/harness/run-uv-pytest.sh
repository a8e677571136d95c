#!/bin/bash
# nextstate's run-uv-pytest.sh (see setup-uv-pytest.sh): the task's test_outputs.py under pytest, with
# the -rA summary the grader reads.
export PATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/.nextstate-uv:$PATH"
uv run pytest "$TEST_DIR/test_outputs.py" -rA
