"""Small numeric helpers used across the package."""

EPSILON = 1e-9


def clamp(value, low, high):
    """Return value limited to the closed range [low, high]."""
    if low > high:
        raise ValueError("low must not exceed high")
    if value < low:
        return low
    if value > high:
        return high
    return value


def mean(values):
    """Arithmetic mean of a non-empty sequence."""
    if not values:
        raise ValueError("mean of empty sequence")
    total = 0
    for v in values:
        total += v
    return total / len(values)


def median(values):
    """Median of a non-empty sequence."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of empty sequence")
    mid = n // 2
    if n % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def percent(part, whole, digits=1):
    """Percentage of part in whole, rounded to digits."""
    if whole == 0:
        return 0.0
    return round(100.0 * part / whole, digits)


def is_close(a, b, tol=EPSILON):
    """Whether two numbers differ by at most tol."""
    return abs(a - b) <= tol
