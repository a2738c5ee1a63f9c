"""Splitting result lists into pages."""


def page_count(total, per_page):
    """Number of pages needed for `total` items, `per_page` to a page."""
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return total // per_page


def paginate(items, per_page, page):
    """Items of 1-based `page`; an empty list past the last page."""
    if page < 1 or page > page_count(len(items), per_page):
        return []
    start = (page - 1) * per_page
    return items[start:start + per_page]
