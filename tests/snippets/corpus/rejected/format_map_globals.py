# expect: format-string-escape
def f():
    pass


print("{f.__init__.__globals__}".format_map({"f": f}))
