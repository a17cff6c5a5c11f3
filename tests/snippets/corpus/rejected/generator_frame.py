# expect: forbidden-attribute
def gen():
    yield 1


g = gen()
print(sorted(g.gi_frame.f_back.f_globals))
