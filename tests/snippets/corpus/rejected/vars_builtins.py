# expect: dunder-subscript, forbidden-name
print(vars()["__builtins__"])
