# expect: forbidden-attribute
import logging

handler = logging.FileHandler("/tmp/corral-validator-probe.log", delay=True)
print(handler)
