"""The errors qsync raises: one base class, one subclass per kind of failure.

`qsync.plan` and `qsync.passes.run` raise these with the message the
`qsyncc` command prints after `error: ` for the same input. `PlanError` is
also what `Plan.load` and `apply_plan` raise for a plan directory that
cannot be read or does not fit the job.
"""


class QsyncError(Exception):
    """Base class of qsync's errors."""


class OptionError(QsyncError, ValueError):
    """An option or flag the `qsyncc` command would refuse (an unknown pass,
    a value out of range, an unreadable statistics file)."""


class TargetError(OptionError):
    """The targets, cluster file or memory limits are malformed or name a
    device the device table lacks."""


class ModelError(QsyncError, ValueError):
    """The model cannot be read or imported (the message names the file and,
    where there is one, the node)."""


class PlanError(QsyncError, ValueError):
    """The model was read but could not be planned; or a plan directory that
    cannot be read or does not fit the job."""


class PassError(QsyncError):
    """A pass failed on the model or left a graph the verifier refuses (the
    message names the model, the pass and the node)."""


class OutputError(QsyncError, OSError):
    """The plan directory or the rewritten model could not be written."""
