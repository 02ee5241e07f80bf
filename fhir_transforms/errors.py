"""Why a record was not written. Messages name paths, categories and reasons; never values."""


class InputError(ValueError):
    """Bad input: not JSON, not FHIR R4, fails validation, or cannot be de-identified as given (exit 2)."""


class RecordRefused(RuntimeError):
    """The record was refused: a detector failed, the leak guard found a survivor, or an unknown
    modifierExtension (exit 3). Nothing of the record is written."""


class LeakFound(RecordRefused):
    """The leak guard found a known identifier in the output: the record is refused (exit 3; HTTP 422 security)."""


class UnknownModifier(RecordRefused):
    """A modifierExtension the profile does not allow: its meaning cannot be kept, so the resource is refused."""


class OutputInvalid(RecordRefused):
    """The de-identified output failed validation: a bug, and nothing is written."""


class DetectorFailed(RecordRefused):
    """A detector failed or timed out: the record is refused (exit 3); over HTTP this is 503, not 422."""


class SettingsError(ValueError):
    """The settings cannot make an engine: a bad key, profile, stack or date. The message names which (exit 2)."""
