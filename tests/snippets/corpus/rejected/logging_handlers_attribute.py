# expect: forbidden-import
import logging

try:
    print(logging.handlers.RotatingFileHandler)
except AttributeError:
    print("logging.handlers not loaded")
