# expect: dunder-subscript, forbidden-attribute
# A class namespace built from a dict display reaches the same dataclasses injection
# without a class statement (type(type(1)) is `type`).
import dataclasses

T = type(type(1))
C = T("C", (), {"a": 1, "__module__": "logging", "__annotations__": {"a,print(open)": int}})
print(dataclasses.dataclass(init=False, repr=False)(C))
