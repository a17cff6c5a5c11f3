# expect: forbidden-attribute
# A string inside a typing subscript becomes a ForwardRef whose _evaluate() evals it with
# typing's (real) builtins.
import typing

ref = typing.get_args(typing.List["open"])[0]
print(ref._evaluate({}, {}, frozenset()))
