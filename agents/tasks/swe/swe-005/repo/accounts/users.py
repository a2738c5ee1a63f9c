"""User records and how they are shown."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class User:
    name: str
    email: Optional[str] = None


def display_name(user):
    """'name <email>' with the address lower-cased; just the name without one."""
    email = user.email.lower()
    return f"{user.name} <{email}>"


def sort_users(users):
    return sorted(users, key=lambda u: u.name.casefold())
