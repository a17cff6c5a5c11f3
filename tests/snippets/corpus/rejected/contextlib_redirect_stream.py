# expect: forbidden-attribute
# redirect_stdout keeps the name of the sys attribute it swaps in _stream: set it to
# "modules" and __enter__ hands back sys.modules.
import contextlib

r = contextlib.redirect_stdout(None)
r._stream = "modules"
with r:
    mods = r._old_targets[0]
print(mods["os"].getcwd())
