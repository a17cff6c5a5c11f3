# expect: non-type-annotation
def f(x: "len([1, 2]) + 1") -> None:
    print(x)


f(1)
