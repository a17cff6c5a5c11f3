# expect: forbidden-attribute
from functools import singledispatch
from typing import NamedTuple

X = NamedTuple("X", [("a", "len(" + "[1, 2])")])


@singledispatch
def f(value):
    return value


try:
    f.register(X(1))
except TypeError as exc:
    print("refused", exc)
