"""The one exception type that means "the user's input is wrong": one sentence, exit code 2."""


class UserError(Exception):
    """Bad input or an unusable environment. The message is one sentence a user can act on."""

    exit_code = 2
