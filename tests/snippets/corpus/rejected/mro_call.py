# expect: forbidden-attribute
print(int.mro())
