"""Errors the patch engine raises; each says what went wrong and where."""

from __future__ import annotations


class PatchError(Exception):
    """Any failure to apply, revert or inspect a patch. The message names what and where."""


class AnchorError(PatchError):
    def __init__(
        self, *, patch_id: str, relpath: str, anchor: str, engine: str, engine_version: str, problem: str
    ) -> None:
        self.patch_id = patch_id
        self.relpath = relpath
        self.anchor = anchor
        self.engine = engine
        self.engine_version = engine_version
        super().__init__(
            f"patch {patch_id}: anchor {anchor} {problem} in {relpath} ({engine} {engine_version}); "
            "nothing was written"
        )


class DriftError(PatchError):
    """Files changed since they were patched; they are named and left alone."""

    def __init__(self, message: str, files: list[str]) -> None:
        self.files = files
        super().__init__(message)


class LockTimeout(PatchError):
    pass


class UsageError(PatchError):
    """A user mistake (unknown engine or patch id, nothing installed): exit code 2 on the CLI."""


class RegistryError(PatchError):
    """Two entry points declare the same patch, one does not load, or patches order each other in a
    circle; the message names them (``toolkit.patch_registry``)."""


class CorruptManifest(PatchError):
    """The manifest cannot be parsed or has the wrong shape; ``toolkit repair`` recovers."""


def io_error(exc: OSError, doing: str, path: object = None) -> PatchError:
    """One sentence for a failed file-system call: what was being done, the file, the error."""
    where = path if path is not None else (exc.filename or "?")
    reason = exc.strerror or str(exc) or type(exc).__name__
    code = f" ({errno_name(exc.errno)})" if exc.errno else ""
    return PatchError(f"{doing} {where}: {reason}{code}")


def errno_name(number: int | None) -> str:
    import errno

    return errno.errorcode.get(number or 0, str(number))
