# expect: format-string-escape
def f():
    pass


print("{0.__globals__[__builtins__]}".format(f))
