import unittest

from PKG import config


class TestValues(unittest.TestCase):
    def test_bools(self):
        self.assertIs(config.parse_value(" Yes "), True)
        self.assertIs(config.parse_value("off"), False)

    def test_numbers(self):
        self.assertEqual(config.parse_value("42"), 42)
        self.assertEqual(config.parse_value("2.5"), 2.5)

    def test_string(self):
        self.assertEqual(config.parse_value(" hello "), "hello")


class TestParse(unittest.TestCase):
    def test_parse(self):
        text = "name = demo\n# comment\n[db]\nport = 5432\ndebug = on  # inline\n"
        self.assertEqual(config.parse(text), {"name": "demo", "db.port": 5432, "db.debug": True})

    def test_value_with_equals(self):
        self.assertEqual(config.parse("url = a=b"), {"url": "a=b"})

    def test_bad_line(self):
        with self.assertRaises(ValueError) as ctx:
            config.parse("a = 1\n\noops\n")
        self.assertIn("line 3", str(ctx.exception))

    def test_dump(self):
        self.assertEqual(config.dump({"b": True, "a": 3}), "a = 3\nb = true")
