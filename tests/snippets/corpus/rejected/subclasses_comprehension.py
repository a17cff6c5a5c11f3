# expect: dunder-attribute
found = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "catch_warnings"]
print(found)
