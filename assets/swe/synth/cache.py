"""A least-recently-used cache."""


class LRUCache:
    """Keeps at most capacity entries, evicting the least recently used."""

    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.order = []
        self.data = {}
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        """Value for key (marking it recently used), or default."""
        if key not in self.data:
            self.misses += 1
            return default
        self.hits += 1
        self.order.remove(key)
        self.order.append(key)
        return self.data[key]

    def put(self, key, value):
        """Store value, evicting the oldest entry when full."""
        if key in self.data:
            self.order.remove(key)
        elif len(self.data) >= self.capacity:
            oldest = self.order.pop(0)
            del self.data[oldest]
        self.data[key] = value
        self.order.append(key)

    def hit_rate(self):
        """Fraction of get calls that found their key."""
        total = self.hits + self.misses
        if total == 0:
            return 0.0
        return self.hits / total
