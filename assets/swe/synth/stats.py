"""Descriptive statistics built on mathutils."""

from . import mathutils


def variance(values):
    """Population variance."""
    m = mathutils.mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def std_dev(values):
    """Population standard deviation."""
    return variance(values) ** 0.5


def normalize(values):
    """Scale values linearly to [0, 1]; constant input maps to zeros."""
    low = min(values)
    high = max(values)
    span = high - low
    if span == 0:
        return [0.0 for _ in values]
    return [(v - low) / span for v in values]


def histogram(values, bins, low, high):
    """Count values into equal-width bins over [low, high]; out-of-range values are clamped."""
    counts = [0] * bins
    width = (high - low) / bins
    for v in values:
        v = mathutils.clamp(v, low, high)
        index = int((v - low) / width)
        if index == bins:
            index = bins - 1
        counts[index] += 1
    return counts


def moving_average(values, window):
    """Means of each run of window consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    for start in range(len(values) - window + 1):
        out.append(mathutils.mean(values[start : start + window]))
    return out
