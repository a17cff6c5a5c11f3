# expect: forbidden-name, non-ascii-identifier
print(𝐞𝐯𝐚𝐥("1 + 1"))
