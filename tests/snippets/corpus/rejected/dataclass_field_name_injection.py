# expect: dunder-name, forbidden-attribute
# dataclasses writes field names into the source of the methods it generates and execs
# it in the globals of the module named by __module__: a class body that sets
# __annotations__ and __module__ runs code with logging's globals (os, real builtins).
import dataclasses


class C:
    __module__ = "logging"
    __annotations__ = {"a,print(open, os)": int}
    a = 1


D = dataclasses.dataclass(init=False, repr=False)(C)
print(D() == D())
