# expect: forbidden-name
print(getattr(1, "__cla" + "ss__"))
