import unittest

from PKG import report


class TestReport(unittest.TestCase):
    def test_summary(self):
        self.assertEqual(report.summary("latency", [1, 2, 6]), "latency: n=3 mean=3.00 spread=5")

    def test_summary_long_name(self):
        self.assertEqual(report.summary("a very long column", [2]), "a very lo...: n=1 mean=2.00 spread=0")

    def test_table(self):
        self.assertEqual(report.table([["a", 1], ["bb", 22]], width=4), "a   |1\nbb  |22")

    def test_table_truncates(self):
        self.assertEqual(report.table([["abcdefgh", "x"]], width=5), "ab...|x")

    def test_zscores(self):
        self.assertEqual(report.zscores([2, 4, 4, 4, 5, 5, 7, 9])[0], -1.5)

    def test_zscores_constant(self):
        self.assertEqual(report.zscores([3, 3, 3]), [0.0, 0.0, 0.0])
