# expect: positional-pattern
# `int` rebound to a class whose __match_args__ names any attribute: a self-matching
# builtin is only trusted when its name is never bound in the file.
class Fake:
    __match_args__ = ("real",)


int = Fake
match 3:
    case int(value):
        print(value)
