# expect: format-string-escape
print("{0.__class__}".format(1))
