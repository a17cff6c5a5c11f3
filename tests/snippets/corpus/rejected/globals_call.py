# expect: forbidden-name
print(sorted(globals()))
