# expect: forbidden-name
def eval(text):
    return text


print(eval("x"))
