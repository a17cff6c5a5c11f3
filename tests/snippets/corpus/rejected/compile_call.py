# expect: forbidden-name
code = compile("1 + 1", "<s>", "eval")
print(code)
