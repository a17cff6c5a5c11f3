# expect: positional-pattern, module-value, forbidden-attribute
# The reported bypass: abc.ABC gives a metaclass without metaclass=, __subclasshook__ makes
# any object match, and the positional sub-pattern reads the attribute `__match_args__`
# names (a string the validator never saw): logging.os.
import abc
import logging


class Any(abc.ABC):
    __match_args__ = ("os",)

    @classmethod
    def __subclasshook__(cls, other):
        return True


match logging:
    case Any(found):
        print(found.getcwd())
