# expect: forbidden-name
class A:
    pass


setattr(A, "x", 1)
print(A.x)
