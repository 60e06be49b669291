import unittest

from PKG import stats


class TestSpread(unittest.TestCase):
    def test_variance(self):
        self.assertEqual(stats.variance([1, 2, 3, 4]), 1.25)

    def test_std_dev(self):
        self.assertEqual(stats.std_dev([2, 4, 4, 4, 5, 5, 7, 9]), 2.0)

    def test_normalize(self):
        self.assertEqual(stats.normalize([2, 4, 6]), [0.0, 0.5, 1.0])

    def test_normalize_constant(self):
        self.assertEqual(stats.normalize([3, 3]), [0.0, 0.0])


class TestBinning(unittest.TestCase):
    def test_histogram(self):
        self.assertEqual(stats.histogram([0, 1, 2, 3, 4, 10, -5], 2, 0, 4), [3, 4])

    def test_histogram_three_bins(self):
        self.assertEqual(stats.histogram([0, 5, 9], 3, 0, 9), [1, 1, 1])

    def test_moving_average(self):
        self.assertEqual(stats.moving_average([1, 2, 3, 4], 2), [1.5, 2.5, 3.5])

    def test_moving_average_full(self):
        self.assertEqual(stats.moving_average([2, 4], 2), [3.0])

    def test_moving_average_bad_window(self):
        with self.assertRaises(ValueError):
            stats.moving_average([1, 2], 0)
