"""The one error type commands raise for problems the user can fix."""


class UserError(Exception):
    """A message for the operator, printed without a traceback; exits non-zero."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
