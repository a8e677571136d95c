"""The run viewer: ``python -m viewer RUN`` (see :mod:`viewer.cli`), a page on 127.0.0.1 to read a
run of ``python -m train`` or ``python -m train.evaluate`` step by step.

* :mod:`viewer.index` -- :class:`RunIndex`, the run folder's episodes read incrementally from its logs.
* :mod:`viewer.images` -- :func:`image_ref`: screenshots in the records (files beside the logs or base64).
* :mod:`viewer.server` -- :func:`make_server`, the page and its JSON API; :func:`export`, the page as one file.
* :mod:`viewer.cli` -- :func:`main`, the command line; ``page.html``, the page itself.
"""

from nextstate.viewer.cli import main
from nextstate.viewer.images import image_ref
from nextstate.viewer.index import RunIndex
from nextstate.viewer.server import export, make_server, to_json

__all__ = ["RunIndex", "export", "image_ref", "main", "make_server", "to_json"]
