import copy
import functools
from functools import wraps


def traced(fn):
    @wraps(fn)
    def inner(*args):
        return fn(*args)

    return inner


def counted(fn):
    @functools.wraps(fn)
    def inner(*args):
        inner.calls += 1
        return fn(*args)

    inner.calls = 0
    return inner


@traced
@counted
def add(a, b):
    return a + b


class Stack:
    __slots__ = ("items",)

    def __init__(self):
        self.items = []

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    __hash__ = None


nested = {"a": [1, 2, {"b": 3}]}
clone = copy.deepcopy(nested)
clone["a"][2]["b"] = 4
print(add(1, 2), add.__name__, nested, clone, len(Stack()))
