import unittest

from PKG import mathutils


class TestClamp(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(mathutils.clamp(5, 0, 10), 5)

    def test_below(self):
        self.assertEqual(mathutils.clamp(-3, 0, 10), 0)

    def test_above(self):
        self.assertEqual(mathutils.clamp(15, 0, 10), 10)

    def test_bounds_inclusive(self):
        self.assertEqual(mathutils.clamp(10, 0, 10), 10)
        self.assertEqual(mathutils.clamp(0, 0, 10), 0)

    def test_bad_range(self):
        with self.assertRaises(ValueError):
            mathutils.clamp(1, 5, 2)


class TestAverages(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mathutils.mean([2, 4, 9]), 5)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mathutils.mean([])

    def test_median_odd(self):
        self.assertEqual(mathutils.median([5, 1, 3]), 3)

    def test_median_even(self):
        self.assertEqual(mathutils.median([4, 1, 3, 2]), 2.5)

    def test_median_empty(self):
        with self.assertRaises(ValueError):
            mathutils.median([])

    def test_percent(self):
        self.assertEqual(mathutils.percent(1, 3), 33.3)
        self.assertEqual(mathutils.percent(5, 0), 0.0)

    def test_is_close(self):
        self.assertTrue(mathutils.is_close(0.1 + 0.2, 0.3))
        self.assertFalse(mathutils.is_close(1.0, 1.1))
