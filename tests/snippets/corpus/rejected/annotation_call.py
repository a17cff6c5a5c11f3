# expect: non-type-annotation
def f(x: print("annotation ran")) -> None:
    pass


f(1)
