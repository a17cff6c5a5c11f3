# expect: dunder-attribute, forbidden-attribute
try:
    1 / 0
except ZeroDivisionError as exc:
    frame = exc.__traceback__.tb_frame
    print(sorted(frame.f_globals))
