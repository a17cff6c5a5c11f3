# expect: dunder-name
class A:
    def f(self):
        return __class__


print(A().f())
