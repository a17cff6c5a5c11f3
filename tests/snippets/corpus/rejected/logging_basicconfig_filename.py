# expect: forbidden-keyword
import logging

logging.basicConfig(filename="/tmp/corral-validator-probe.log")
print("configured")
