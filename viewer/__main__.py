"""``python -m viewer RUN`` (``python -m nextstate.viewer RUN`` from anywhere): :func:`viewer.cli.main`."""

import sys

from nextstate.viewer.cli import main

if __name__ == "__main__":
    sys.exit(main())
