# expect: dunder-attribute, non-ascii-identifier
print(().__ｃｌａｓｓ__)
