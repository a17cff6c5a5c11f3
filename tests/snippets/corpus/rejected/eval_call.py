# expect: forbidden-name
print(eval("1 + 1"))
