# expect: forbidden-name
with open("/etc/passwd") as fh:
    print(len(fh.read()))
