# expect: forbidden-attribute
import string

print(string.Formatter().get_field("0.real", (1,), {}))
