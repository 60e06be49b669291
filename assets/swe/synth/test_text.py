import unittest

from PKG import text


class TestSlug(unittest.TestCase):
    def test_slugify(self):
        self.assertEqual(text.slugify("Hello, World!"), "hello-world")

    def test_slugify_sep(self):
        self.assertEqual(text.slugify("A b  C", sep="_"), "a_b_c")

    def test_word_counts(self):
        self.assertEqual(text.word_counts("to be or not to BE"), {"to": 2, "be": 2, "or": 1, "not": 1})


class TestLayout(unittest.TestCase):
    def test_truncate_short(self):
        self.assertEqual(text.truncate("abc", 5), "abc")

    def test_truncate_exact(self):
        self.assertEqual(text.truncate("abcde", 5), "abcde")

    def test_truncate_long(self):
        self.assertEqual(text.truncate("abcdefgh", 6), "abc...")

    def test_truncate_tiny(self):
        self.assertEqual(text.truncate("abcdefgh", 2), "..")

    def test_wrap(self):
        self.assertEqual(text.wrap("aa bb cc dd", 5), ["aa bb", "cc dd"])

    def test_wrap_long_word(self):
        self.assertEqual(text.wrap("abcdefg hi", 4), ["abcdefg", "hi"])

    def test_wrap_empty(self):
        self.assertEqual(text.wrap("", 3), [])

    def test_title_case(self):
        self.assertEqual(text.title_case("the lord OF the rings"), "The Lord of the Rings")
