# expect: forbidden-attribute
# global_enum writes the members into sys.modules[cls.__module__]: with module="builtins"
# a member replaces a real builtin that the standard library then calls with its own
# arguments (dataclasses calls exec(source, module_globals)).
import enum


class Spy(enum.Enum):
    def __call__(self, *args):
        print(args)


enum.global_enum(Spy("E", "ex" + "ec", module="builtins"))
