# expect: forbidden-attribute
import logging

print(logging.currentframe())
