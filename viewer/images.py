"""Images in a run's records: a file beside the logs, a data URI, or bare base64 (older runs)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

_IMAGE_FILE = re.compile(r"^[\w./-]+\.(png|jpe?g|webp|gif)$", re.IGNORECASE)
_B64_MAGIC = {"iVBORw0KGgo": "image/png", "/9j/": "image/jpeg"}


def image_ref(value: str, run: Path) -> str | None:
    """``value`` as an image: a file under ``run``, a data URI, or bare base64 (older runs)."""
    if value.startswith("data:image/"):
        return value
    if len(value) > 64:
        for magic, mime in _B64_MAGIC.items():
            if value.startswith(magic):
                return f"data:{mime};base64,{value}"
        return None
    if _IMAGE_FILE.match(value):
        path = (run / value).resolve()
        if path.is_relative_to(run.resolve()) and path.is_file():
            return value
    return None


def mark_images(obj: Any, run: Path, link: Callable[[str], str], found: list[str] | None = None) -> Any:
    """``obj`` with every image reference replaced by ``{"__image__": url}`` (urls also in ``found``)."""
    if isinstance(obj, str):
        ref = image_ref(obj, run)
        if ref is None:
            return obj
        url = ref if ref.startswith("data:") else link(ref)
        if found is not None:
            found.append(url)
        return {"__image__": url}
    if isinstance(obj, list):
        return [mark_images(v, run, link, found) for v in obj]
    if isinstance(obj, dict):
        return {k: mark_images(v, run, link, found) for k, v in obj.items()}
    return obj
