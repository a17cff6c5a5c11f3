class AppError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


try:
    raise AppError("bad", 3)
except AppError as exc:
    print("caught", exc, exc.code, exc.args)
finally:
    print("done")
