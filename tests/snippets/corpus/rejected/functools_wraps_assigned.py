# expect: forbidden-attribute, module-value
# wraps(wrapped, assigned=...) is update_wrapper with the snippet's strings; only the plain
# @wraps(func) form is allowed.
import functools
import logging

got = []


class Catch:
    def __setattr__(self, name, value):
        got.append(value)


functools.wraps(logging, ("os",), ())(Catch())
print(got[0].getcwd())
