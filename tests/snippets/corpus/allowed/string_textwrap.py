import string
import textwrap
import difflib

tmpl = string.Template("$who likes $what")
print(tmpl.substitute(who="tim", what="kung pao"))
print(textwrap.fill("lorem ipsum " * 10, width=30))
print(list(difflib.unified_diff(["a", "b"], ["a", "c"], lineterm="")))
print(string.ascii_lowercase)
