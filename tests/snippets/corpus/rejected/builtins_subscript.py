# expect: forbidden-name
print(__builtins__["eval"] if isinstance(__builtins__, dict) else __builtins__)
