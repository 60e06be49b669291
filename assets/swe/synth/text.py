"""Text helpers: slugs, word counts and wrapping."""

import re

_WORD = re.compile(r"[A-Za-z0-9]+")


def slugify(title, sep="-"):
    """Lower-case title words joined by sep."""
    words = _WORD.findall(title)
    return sep.join(w.lower() for w in words)


def word_counts(text):
    """Map each lower-cased word to its number of occurrences."""
    counts = {}
    for word in _WORD.findall(text):
        key = word.lower()
        counts[key] = counts.get(key, 0) + 1
    return counts


def truncate(text, width, suffix="..."):
    """Cut text to at most width characters, ending with suffix when cut."""
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)] + suffix


def wrap(text, width):
    """Greedy word wrap into lines of at most width characters."""
    lines = []
    current = ""
    for word in text.split():
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def title_case(text, small=("a", "an", "the", "of")):
    """Capitalise words except small ones (the first word is always capitalised)."""
    out = []
    for i, word in enumerate(text.split()):
        if i > 0 and word.lower() in small:
            out.append(word.lower())
        else:
            out.append(word[:1].upper() + word[1:].lower())
    return " ".join(out)
