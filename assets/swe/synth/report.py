"""Plain-text reports of numeric columns."""

from . import stats
from . import text


def summary(name, values):
    """One line: name, count, mean and spread."""
    label = text.truncate(name, 12)
    mean = sum(values) / len(values)
    spread = max(values) - min(values)
    return "%s: n=%d mean=%.2f spread=%s" % (label, len(values), mean, spread)


def table(rows, width=10):
    """Left-aligned fixed-width columns; cells longer than width are truncated."""
    lines = []
    for row in rows:
        cells = [text.truncate(str(c), width).ljust(width) for c in row]
        lines.append("|".join(cells).rstrip())
    return "\n".join(lines)


def zscores(values):
    """Standard scores of values (0 for constant input)."""
    m = sum(values) / len(values)
    sd = stats.std_dev(values)
    if sd == 0:
        return [0.0] * len(values)
    return [(v - m) / sd for v in values]
