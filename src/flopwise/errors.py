"""The exceptions the CLI prints as one line: mistakes a person can fix, and a saved preemption."""


class UserError(Exception):
    """A problem with the user's input (config, file, name), shown without a traceback.

    Raise it with a message that names what is wrong and where, and, when there is a
    small set of right answers, what is allowed.
    """

    exit_code = 2


PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): "try again later"; torchrun/Slurm relaunch on it


class Preempted(UserError):
    """The run stopped on a signal after saving; rerunning the same command continues it.

    Torch-free (here, not in train/checkpoint/policy.py) so that launchers can catch it
    without loading torch.
    """

    exit_code = PREEMPTED_EXIT_CODE
