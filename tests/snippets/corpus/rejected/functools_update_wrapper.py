# expect: forbidden-attribute, module-value
# update_wrapper(wrapper, wrapped, assigned=...) does getattr(wrapped, name) and
# setattr(wrapper, name, value) for every string it is given: logging.os lands in a
# __setattr__ the snippet wrote.
import functools
import logging

got = []


class Catch:
    def __setattr__(self, name, value):
        got.append(value)


functools.update_wrapper(Catch(), logging, assigned=("os",), updated=())
print(got[0].getcwd())
