"""Text crossing component boundaries: byte decoding, Unicode normalisation, clipping.

Every string that enters the agent from outside (model output, tool output, corpus files) goes
through here, so that "Zoë" typed by the model and "Zoe\u0308" stored in a file compare equal.
"""

from __future__ import annotations

import unicodedata


def decode_bytes(data: bytes) -> str:
    """Decodes UTF-8, replacing invalid bytes with U+FFFD instead of failing the whole read."""
    return data.decode("utf-8", errors="replace")


def nfc(text: str) -> str:
    """The canonical composed form used for storage and display."""
    return unicodedata.normalize("NFC", text)


def fold(text: str) -> str:
    """The matching key: NFC then casefold (the tasks README's "normalise")."""
    return unicodedata.normalize("NFC", text).casefold()


def clip(text: str, limit: int, marker: str = " …[clipped]") -> str:
    """At most `limit` characters, saying so when anything was cut; never splits a surrogate."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(marker))] + marker
