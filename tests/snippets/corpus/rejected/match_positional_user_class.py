# expect: positional-pattern
# Positional sub-patterns read attributes by the strings in __match_args__, whatever the
# class: only the builtins that match their subject itself (int(x), str(s), ...) may use them.
class Point:
    __match_args__ = ("x", "y")

    def __init__(self, x, y):
        self.x, self.y = x, y


match Point(1, 2):
    case Point(a, b):
        print(a, b)
