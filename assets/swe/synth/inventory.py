"""Stock keeping: items, quantities and reorder rules."""

from . import mathutils

MAX_STOCK = 1000


class Item:
    """A stocked product."""

    def __init__(self, sku, price, quantity=0):
        self.sku = sku
        self.price = price
        self.quantity = quantity

    def value(self):
        """Total value of the stock of this item."""
        return self.price * self.quantity


class Inventory:
    """A collection of items indexed by SKU."""

    def __init__(self):
        self.items = {}

    def add(self, sku, price, quantity=1):
        """Add quantity of an item, creating it if needed; stock is capped at MAX_STOCK."""
        item = self.items.get(sku)
        if item is None:
            item = Item(sku, price)
            self.items[sku] = item
        item.quantity = mathutils.clamp(item.quantity + quantity, 0, MAX_STOCK)
        return item.quantity

    def remove(self, sku, quantity=1):
        """Take quantity away; raises KeyError for unknown items and ValueError when short."""
        item = self.items[sku]
        if quantity > item.quantity:
            raise ValueError("not enough stock for " + sku)
        item.quantity -= quantity
        return item.quantity

    def total_value(self):
        """Value of the whole inventory."""
        return sum(item.value() for item in self.items.values())

    def needs_reorder(self, threshold=5):
        """SKUs whose quantity is below threshold, sorted."""
        return sorted(sku for sku, item in self.items.items() if item.quantity < threshold)
