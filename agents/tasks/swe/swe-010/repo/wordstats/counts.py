"""Word frequency counts."""

import re
from collections import Counter

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text):
    return _WORD.findall(text)


def word_counts(text):
    """How often each word occurs, ignoring case."""
    return dict(Counter(words(text)))


def most_common(text, n=3):
    return Counter(word_counts(text)).most_common(n)
