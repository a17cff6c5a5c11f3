# expect: forbidden-import
import urllib.request

print(urllib.request.__name__)
