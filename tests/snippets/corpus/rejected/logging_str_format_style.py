# expect: forbidden-attribute
# A {-style logging format walks attributes by a template built at run time.
import logging

style = logging.StrFormatStyle("{msg." + "__init__.__globals__}")
print(style)
