# expect: forbidden-import
# uuid re-exports the platform module (which runs `file` and reads /etc); a module reached
# as an attribute of an allowed module is an import and must be allowed itself.
import uuid

print(uuid.platform.libc_ver())
