# expect: forbidden-name
open = print
del open
print("ok")
