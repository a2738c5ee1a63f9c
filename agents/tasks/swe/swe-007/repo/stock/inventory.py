"""An in-memory inventory of items with tags."""


class Item:
    def __init__(self, name, quantity=0, tags=[]):
        self.name = name
        self.quantity = quantity
        self.tags = tags


class Inventory:
    def __init__(self):
        self._items = {}

    def add(self, name, quantity=0, tags=None):
        if name in self._items:
            raise KeyError(f"{name} already exists")
        item = Item(name, quantity) if tags is None else Item(name, quantity, list(tags))
        self._items[name] = item
        return item

    def get(self, name):
        return self._items[name]

    def tag(self, name, tag):
        item = self._items[name]
        if tag not in item.tags:
            item.tags.append(tag)

    def total_quantity(self):
        return sum(item.quantity for item in self._items.values())
