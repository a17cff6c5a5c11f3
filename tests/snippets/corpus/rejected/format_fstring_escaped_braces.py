# expect: dynamic-format, format-string-escape
print(f"{{0.__class__}}".format(1))
