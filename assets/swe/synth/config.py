"""Parsing of simple key = value configuration text."""

TRUE_WORDS = ("true", "yes", "on")
FALSE_WORDS = ("false", "no", "off")


def parse_value(raw):
    """Turn a raw string into bool, int, float or str."""
    word = raw.strip()
    lower = word.lower()
    if lower in TRUE_WORDS:
        return True
    if lower in FALSE_WORDS:
        return False
    try:
        return int(word)
    except ValueError:
        pass
    try:
        return float(word)
    except ValueError:
        return word


def parse(text):
    """Parse lines of 'key = value'; '#' starts a comment; [section] prefixes keys."""
    result = {}
    section = ""
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip() + "."
            continue
        if "=" not in line:
            raise ValueError("line %d: expected key = value" % number)
        key, value = line.split("=", 1)
        result[section + key.strip()] = parse_value(value)
    return result


def dump(config):
    """Render a flat dict back to 'key = value' lines, sorted by key."""
    lines = []
    for key in sorted(config):
        value = config[key]
        if isinstance(value, bool):
            value = "true" if value else "false"
        lines.append("%s = %s" % (key, value))
    return "\n".join(lines)
