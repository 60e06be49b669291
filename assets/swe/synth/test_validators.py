import unittest

from PKG import validators


class TestValidators(unittest.TestCase):
    def test_email(self):
        self.assertTrue(validators.is_email("Ann@Example.org"))
        self.assertFalse(validators.is_email("ann@example"))
        self.assertFalse(validators.is_email("a b@example.org"))

    def test_password(self):
        self.assertTrue(validators.is_strong_password("Secret123"))
        self.assertFalse(validators.is_strong_password("secret123"))
        self.assertFalse(validators.is_strong_password("SECRET123"))
        self.assertFalse(validators.is_strong_password("Secretxyz"))

    def test_password_length(self):
        self.assertTrue(validators.is_strong_password("Ab3defgh"))
        self.assertFalse(validators.is_strong_password("Ab3defg"))

    def test_luhn(self):
        self.assertTrue(validators.luhn_valid("7992 7398 713"))
        self.assertFalse(validators.luhn_valid("7992 7398 710"))
        self.assertFalse(validators.luhn_valid("5"))

    def test_luhn_doubling(self):
        self.assertTrue(validators.luhn_valid("4539 1488 0343 6467"))

    def test_in_range(self):
        self.assertTrue(validators.in_range(3, 3, 5))
        self.assertFalse(validators.in_range(5, 3, 5))
