"""One exception type for mistakes a person can fix; the CLI prints it as one line."""


class UserError(Exception):
    """A problem with the user's input (config, file, name), shown without a traceback.

    Raise it with a message that names what is wrong and where, and, when there is a
    small set of right answers, what is allowed.
    """

    exit_code = 2
