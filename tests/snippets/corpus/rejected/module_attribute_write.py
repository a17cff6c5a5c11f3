# expect: module-value
# Assigning into a module rebinds names its functions (or another payload file) look up.
import json

json.dumps = print
