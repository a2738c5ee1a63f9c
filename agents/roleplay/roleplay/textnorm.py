"""Text normalisation shared by every component that compares text.

Documents, tool arguments and model output may arrive in different Unicode normalisation
forms (the corpus deliberately stores some files decomposed); comparing them only works if
every side goes through the same function.
"""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[^\W_]+")


def normalize(text: str) -> str:
    """NFC, then case-folded: the comparison form of a string."""
    return unicodedata.normalize("NFC", text).casefold()


def display(text: str) -> str:
    """NFC only: the form in which text is shown to the model."""
    return unicodedata.normalize("NFC", text)


def terms(text: str) -> list[str]:
    """Runs of letters and digits in the comparison form."""
    return _WORD.findall(normalize(text))


def collapse_whitespace(text: str) -> str:
    return " ".join(text.split())
