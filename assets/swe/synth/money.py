"""Amounts of money kept in integer cents."""

from . import mathutils


class Money:
    """An amount in cents with a currency code."""

    def __init__(self, cents, currency="EUR"):
        self.cents = cents
        self.currency = currency

    def __add__(self, other):
        self._check(other)
        return Money(self.cents + other.cents, self.currency)

    def __sub__(self, other):
        self._check(other)
        return Money(self.cents - other.cents, self.currency)

    def __eq__(self, other):
        return self.cents == other.cents and self.currency == other.currency

    def _check(self, other):
        if other.currency != self.currency:
            raise ValueError("currency mismatch")

    def split(self, parts):
        """Split into parts amounts that differ by at most one cent, larger ones first."""
        base = self.cents // parts
        extra = self.cents % parts
        return [Money(base + (1 if i < extra else 0), self.currency) for i in range(parts)]

    def format(self):
        """Render as '12.34 EUR'."""
        sign = "-" if self.cents < 0 else ""
        cents = abs(self.cents)
        return "%s%d.%02d %s" % (sign, cents // 100, cents % 100, self.currency)


def apply_discount(price, percent):
    """Price reduced by percent (0-100, clamped), rounded down to the cent."""
    percent = mathutils.clamp(percent, 0, 100)
    return Money(price.cents * (100 - percent) // 100, price.currency)
