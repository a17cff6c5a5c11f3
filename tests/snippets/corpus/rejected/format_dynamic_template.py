# expect: dynamic-format
template = "{0." + "__class__}"
print(template.format(1))
