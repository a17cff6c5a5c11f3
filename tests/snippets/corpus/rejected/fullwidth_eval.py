# expect: forbidden-name, non-ascii-identifier
print(ｅｖａｌ("1 + 1"))
