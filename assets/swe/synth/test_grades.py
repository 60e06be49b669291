import unittest

from PKG import grades


class TestGrades(unittest.TestCase):
    def test_letter(self):
        self.assertEqual(grades.letter(95), "A")
        self.assertEqual(grades.letter(80), "B")
        self.assertEqual(grades.letter(79), "C")
        self.assertEqual(grades.letter(12), "F")

    def test_curve(self):
        self.assertEqual(grades.curve([60, 70, 80]), [65, 75, 85])

    def test_curve_clamped(self):
        self.assertEqual(grades.curve([0, 100, 125], target_mean=100), [25, 100, 100])

    def test_distribution(self):
        self.assertEqual(grades.distribution([91, 85, 85, 40]), {"A": 1, "B": 2, "C": 0, "D": 0, "F": 1})

    def test_outliers(self):
        scores = [70, 71, 69, 70, 72, 68, 70, 20]
        self.assertEqual(grades.outliers(scores), [20])

    def test_outliers_constant(self):
        self.assertEqual(grades.outliers([50, 50]), [])
