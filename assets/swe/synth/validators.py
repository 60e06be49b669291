"""Input validation helpers."""

import re

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")


def is_email(value):
    """Loose check for name@domain.tld."""
    return bool(_EMAIL.match(value.lower()))


def is_strong_password(value, min_length=8):
    """At least min_length characters with a digit, a lower- and an upper-case letter."""
    if len(value) < min_length:
        return False
    has_digit = any(c.isdigit() for c in value)
    has_lower = any(c.islower() for c in value)
    has_upper = any(c.isupper() for c in value)
    return has_digit and has_lower and has_upper


def luhn_valid(number):
    """Luhn checksum of a digit string (spaces allowed)."""
    digits = [int(c) for c in number if c.isdigit()]
    if len(digits) < 2:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d = d * 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def in_range(value, low, high):
    """Whether low <= value < high."""
    return low <= value < high
