"""Plane geometry: points and axis-aligned rectangles."""


class Point:
    """A point in the plane."""

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def distance(self, other):
        """Euclidean distance to other."""
        dx = self.x - other.x
        dy = self.y - other.y
        return (dx * dx + dy * dy) ** 0.5

    def translate(self, dx, dy):
        """A new point moved by (dx, dy)."""
        return Point(self.x + dx, self.y + dy)


class Rect:
    """An axis-aligned rectangle from its lower-left corner, width and height."""

    def __init__(self, x, y, width, height):
        if width < 0 or height < 0:
            raise ValueError("negative size")
        self.x = x
        self.y = y
        self.width = width
        self.height = height

    def area(self):
        """Width times height."""
        return self.width * self.height

    def perimeter(self):
        """Length of the border."""
        return 2 * (self.width + self.height)

    def contains(self, point):
        """Whether point lies inside or on the border."""
        inside_x = self.x <= point.x <= self.x + self.width
        inside_y = self.y <= point.y <= self.y + self.height
        return inside_x and inside_y

    def intersection(self, other):
        """The overlapping rectangle, or None when they do not overlap."""
        left = max(self.x, other.x)
        bottom = max(self.y, other.y)
        right = min(self.x + self.width, other.x + other.width)
        top = min(self.y + self.height, other.y + other.height)
        if right <= left or top <= bottom:
            return None
        return Rect(left, bottom, right - left, top - bottom)
