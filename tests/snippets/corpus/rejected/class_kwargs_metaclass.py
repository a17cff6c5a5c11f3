# expect: forbidden-keyword, dynamic-class
class Meta(type):
    pass


class A(**{"metaclass": Meta}):
    pass


print(A)
