# expect: dynamic-class, dunder-name
# A class derived from type is a metaclass: calling it with (name, bases, namespace)
# builds classes from run-time strings, and its __instancecheck__ decides isinstance.
class Meta(type):
    def __instancecheck__(cls, other):
        return True


print(Meta)
