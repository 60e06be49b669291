import unittest

from PKG import cache


class TestLRU(unittest.TestCase):
    def test_get_put(self):
        c = cache.LRUCache(2)
        c.put("a", 1)
        self.assertEqual(c.get("a"), 1)

    def test_missing_default(self):
        self.assertEqual(cache.LRUCache(1).get("x", 7), 7)

    def test_eviction(self):
        c = cache.LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.put("c", 3)
        self.assertIsNone(c.get("a"))
        self.assertEqual(c.get("c"), 3)

    def test_recent_use_protects(self):
        c = cache.LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.get("a")
        c.put("c", 3)
        self.assertEqual(c.get("a"), 1)
        self.assertIsNone(c.get("b"))

    def test_update_keeps_size(self):
        c = cache.LRUCache(2)
        c.put("a", 1)
        c.put("b", 2)
        c.put("a", 5)
        self.assertEqual(c.get("b"), 2)
        self.assertEqual(c.get("a"), 5)

    def test_hit_rate(self):
        c = cache.LRUCache(2)
        self.assertEqual(c.hit_rate(), 0.0)
        c.put("a", 1)
        c.get("a")
        c.get("b")
        c.get("a")
        self.assertAlmostEqual(c.hit_rate(), 2 / 3)

    def test_bad_capacity(self):
        with self.assertRaises(ValueError):
            cache.LRUCache(0)
