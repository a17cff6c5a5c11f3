from dataclasses import dataclass


@dataclass
class Point:
    x: int
    y: int


def where(value):
    match value:
        case Point(x=0, y=0):
            return "origin"
        case Point(x=x, y=y) if x == y:
            return f"diagonal {x}"
        case int(n) | float(n):
            return f"number {n}"
        case str(text):
            return f"text {text!r}"
        case [Point() as first, *_]:
            return f"starts at {first}"
        case _:
            return "other"


print(where(Point(0, 0)), where(Point(2, 2)), where(3), where("a"), where([Point(1, 2)]))
