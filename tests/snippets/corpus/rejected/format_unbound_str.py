# expect: dynamic-format
template = "{0." + "__class__}"
print(str.format(template, 1))
