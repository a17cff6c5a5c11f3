# expect: forbidden-attribute
import logging

print(logging.os.getcwd())
