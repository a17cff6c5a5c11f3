# expect: forbidden-import
import logging.handlers

print(logging.handlers.RotatingFileHandler)
