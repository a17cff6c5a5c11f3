# expect: forbidden-attribute
import enum

print(enum.bltns.len("abc"))
