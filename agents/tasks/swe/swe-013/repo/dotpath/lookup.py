"""Reading nested data with dotted paths such as 'a.b.0'."""

_MISSING = object()


def get_path(data, path, default=None):
    current = data
    for segment in path.split("."):
        try:
            current = current[segment]
        except (KeyError, TypeError):
            return default
    return current
