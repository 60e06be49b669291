import unittest

from PKG import inventory


class TestInventory(unittest.TestCase):
    def setUp(self):
        self.inv = inventory.Inventory()
        self.inv.add("apple", 3, 10)
        self.inv.add("pear", 5, 2)

    def test_add_existing(self):
        self.assertEqual(self.inv.add("apple", 3, 5), 15)

    def test_add_new_default(self):
        self.assertEqual(self.inv.add("plum", 1), 1)

    def test_add_capped(self):
        self.assertEqual(self.inv.add("apple", 3, 5000), 1000)

    def test_remove(self):
        self.assertEqual(self.inv.remove("apple", 4), 6)

    def test_remove_all(self):
        self.assertEqual(self.inv.remove("pear", 2), 0)

    def test_remove_too_many(self):
        with self.assertRaises(ValueError):
            self.inv.remove("pear", 3)

    def test_remove_unknown(self):
        with self.assertRaises(KeyError):
            self.inv.remove("kiwi")

    def test_total_value(self):
        self.assertEqual(self.inv.total_value(), 40)

    def test_item_value(self):
        self.assertEqual(inventory.Item("x", 4, 3).value(), 12)

    def test_needs_reorder(self):
        self.inv.add("fig", 1, 5)
        self.assertEqual(self.inv.needs_reorder(), ["pear"])
        self.assertEqual(self.inv.needs_reorder(threshold=11), ["apple", "fig", "pear"])
