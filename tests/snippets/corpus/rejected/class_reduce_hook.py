# expect: dunder-name
# __reduce_ex__ makes copy call any callable and then setattr(result, key, value) for the
# keys of the returned state: an attribute write by string.
import copy


class Writer:
    def __reduce_ex__(self, protocol):
        return (Writer, (), (None, {"note": "written"}))


print(copy.copy(Writer()).note)
