# expect: dunder-attribute
match 1:
    case object(__class__=cls):
        print(cls)
