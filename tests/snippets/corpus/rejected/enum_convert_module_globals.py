# expect: forbidden-attribute
# Enum._convert_ builds members from any module's globals (sys.modules[name].__dict__).
import enum

E = enum.Enum._convert_("E", "builtins", lambda name: name == "open")
print(E)
