# expect: forbidden-attribute
# Keyword sub-patterns read attributes by name too: the name is checked like `x.os`.
match 1:
    case object(os=found):
        print(found)
