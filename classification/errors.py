"""The one exception type the command-line tools turn into a clean error message."""


class UsageError(ValueError):
    """Bad user input (paths, model names, checkpoints, options): reported, exit code 2."""


class BadImageError(UsageError):
    """An image file of the data set cannot be read (message names the file)."""
