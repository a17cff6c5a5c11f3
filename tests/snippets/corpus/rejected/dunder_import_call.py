# expect: forbidden-name
os = __import__("os")
print(os.getcwd())
