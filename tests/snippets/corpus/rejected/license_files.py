# expect: forbidden-name
print(type(license))
