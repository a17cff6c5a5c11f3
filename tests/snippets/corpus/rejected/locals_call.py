# expect: forbidden-name
def f():
    return locals()


print(f())
