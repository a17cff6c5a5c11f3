# expect: forbidden-name
exec("print(42)")
