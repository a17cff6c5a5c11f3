# expect: forbidden-import
from os import system

system("id")
