# expect: forbidden-import
from logging import config

print(config.dictConfig)
