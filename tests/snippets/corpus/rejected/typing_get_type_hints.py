# expect: forbidden-attribute
import typing

X = typing.NamedTuple("X", [("a", "len(" + "[1, 2])")])
print(typing.get_type_hints(X))
