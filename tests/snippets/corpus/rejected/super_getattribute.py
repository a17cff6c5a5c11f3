# expect: dunder-attribute
class A:
    def peek(self):
        return super().__getattribute__("peek")


print(A().peek())
