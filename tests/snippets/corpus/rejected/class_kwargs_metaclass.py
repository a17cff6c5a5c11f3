# expect: forbidden-keyword
class Meta(type):
    pass


class A(**{"metaclass": Meta}):
    pass


print(A)
