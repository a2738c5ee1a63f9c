import unittest

from stock.inventory import Inventory


class InventoryTest(unittest.TestCase):
    def test_tags_are_per_item(self):
        inv = Inventory()
        inv.add("bolt")
        inv.add("nut")
        inv.tag("bolt", "metal")
        self.assertEqual(inv.get("nut").tags, [])
        self.assertEqual(inv.get("bolt").tags, ["metal"])

    def test_total(self):
        inv = Inventory()
        inv.add("a", 2)
        inv.add("b", 3, tags=["x"])
        self.assertEqual(inv.total_quantity(), 5)


if __name__ == "__main__":
    unittest.main()
