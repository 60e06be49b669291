import unittest

from PKG import geometry


class TestPoint(unittest.TestCase):
    def test_distance(self):
        self.assertEqual(geometry.Point(1, 1).distance(geometry.Point(4, 5)), 5.0)

    def test_translate(self):
        p = geometry.Point(1, 2).translate(3, -1)
        self.assertEqual((p.x, p.y), (4, 1))


class TestRect(unittest.TestCase):
    def test_area(self):
        self.assertEqual(geometry.Rect(0, 0, 3, 4).area(), 12)

    def test_perimeter(self):
        self.assertEqual(geometry.Rect(0, 0, 3, 4).perimeter(), 14)

    def test_contains(self):
        r = geometry.Rect(0, 0, 3, 4)
        self.assertTrue(r.contains(geometry.Point(1, 1)))
        self.assertTrue(r.contains(geometry.Point(3, 4)))
        self.assertFalse(r.contains(geometry.Point(4, 1)))
        self.assertFalse(r.contains(geometry.Point(1, 5)))

    def test_intersection(self):
        r = geometry.Rect(0, 0, 4, 4).intersection(geometry.Rect(2, 1, 5, 5))
        self.assertEqual((r.x, r.y, r.width, r.height), (2, 1, 2, 3))

    def test_disjoint(self):
        self.assertIsNone(geometry.Rect(0, 0, 1, 1).intersection(geometry.Rect(5, 5, 1, 1)))

    def test_touching(self):
        self.assertIsNone(geometry.Rect(0, 0, 2, 2).intersection(geometry.Rect(2, 0, 2, 2)))

    def test_negative_size(self):
        with self.assertRaises(ValueError):
            geometry.Rect(0, 0, -1, 2)
