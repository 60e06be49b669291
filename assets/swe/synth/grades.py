"""Course grading built on stats."""

from . import mathutils
from . import stats

CUTOFFS = ((90, "A"), (80, "B"), (70, "C"), (60, "D"))


def letter(score):
    """Letter grade of a 0-100 score."""
    for cutoff, grade in CUTOFFS:
        if score >= cutoff:
            return grade
    return "F"


def curve(scores, target_mean=75):
    """Shift scores so their mean is target_mean, clamped to 0-100."""
    shift = target_mean - mathutils.mean(scores)
    return [mathutils.clamp(s + shift, 0, 100) for s in scores]


def distribution(scores):
    """Count of each letter grade, A to F."""
    counts = {"A": 0, "B": 0, "C": 0, "D": 0, "F": 0}
    for s in scores:
        counts[letter(s)] += 1
    return counts


def outliers(scores, limit=2.0):
    """Scores more than limit standard deviations from the mean."""
    sd = stats.std_dev(scores)
    if sd == 0:
        return []
    m = mathutils.mean(scores)
    return [s for s in scores if abs(s - m) / sd > limit]
