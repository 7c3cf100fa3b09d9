"""Errors a user can cause (bad files, impossible plans, bad requests). The CLI prints them as one
line and exits with `exit_code`; the server turns them into OpenAI-shaped error objects."""


class UserError(Exception):
    exit_code = 1


class GGUFError(UserError):
    """A GGUF file is malformed or is not a model tightfit can run. The message names the file and
    the tensor or key at fault."""


class PlanError(UserError):
    """The model does not fit the budget; exit code 2 as `tightfit plan` documents."""
    exit_code = 2
