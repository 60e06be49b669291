import unittest

from PKG import money


class TestMoney(unittest.TestCase):
    def test_add(self):
        self.assertEqual((money.Money(150) + money.Money(275)).cents, 425)

    def test_sub(self):
        self.assertEqual((money.Money(150) - money.Money(275)).cents, -125)

    def test_currency_mismatch(self):
        with self.assertRaises(ValueError):
            money.Money(1, "EUR") + money.Money(1, "USD")

    def test_equality(self):
        self.assertTrue(money.Money(5, "USD") == money.Money(5, "USD"))
        self.assertFalse(money.Money(5, "USD") == money.Money(5, "EUR"))

    def test_split(self):
        parts = [m.cents for m in money.Money(100).split(3)]
        self.assertEqual(parts, [34, 33, 33])

    def test_split_even(self):
        self.assertEqual([m.cents for m in money.Money(90).split(3)], [30, 30, 30])

    def test_format(self):
        self.assertEqual(money.Money(1234).format(), "12.34 EUR")
        self.assertEqual(money.Money(-5, "USD").format(), "-0.05 USD")


class TestDiscount(unittest.TestCase):
    def test_discount(self):
        self.assertEqual(money.apply_discount(money.Money(999), 10).cents, 899)

    def test_discount_clamped(self):
        self.assertEqual(money.apply_discount(money.Money(500), 150).cents, 0)
        self.assertEqual(money.apply_discount(money.Money(500), -20).cents, 500)
