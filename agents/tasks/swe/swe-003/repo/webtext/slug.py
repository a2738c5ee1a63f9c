"""URL slugs from titles."""

import re

_NON_WORD = re.compile(r"[^a-z0-9]+")


def slugify(title, separator="-"):
    """Lower-case ASCII slug: runs of other characters become one separator."""
    text = title.lower()
    slug = _NON_WORD.sub(separator, text)
    return slug.strip(separator)
