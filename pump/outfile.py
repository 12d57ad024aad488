"""Files pump writes where its user names them: --stats, --trace, timelines, plots,
generated traces.

Such a path may lie in a directory other users can write (/tmp, a shared project
directory), and pump may run as root there; so, whatever the kernel's
fs.protected_symlinks says, pump never follows a symbolic link at the path and never
writes into a file that is not the caller's own. What it writes in one go
(open_output) goes to a new file beside the path, renamed over it once complete: a
reader never sees half a file, and a failed run leaves what was there. A file that
grows while a job runs (a trace pumpd appends to: open_in_place) is written in place,
after the same checks.

Refusals are OSError (Refused) whose strerror says what is wrong, so callers that
print ``exc.strerror`` for a path that cannot be written say it as they say others."""

import errno
import gzip
import io
import os
import stat
import tempfile


class Refused(OSError):
    """A path pump will not write (a link, not a regular file, another user's file)."""

    def __init__(self, why: str):
        super().__init__(errno.EPERM, why)


def _refuse_unsafe(info: os.stat_result):
    if stat.S_ISLNK(info.st_mode):
        raise Refused("a symbolic link; pump writes only to a regular file (give the link's target)")
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if not stat.S_ISREG(info.st_mode):
        raise Refused("not a regular file; pump writes only to a regular file")
    if info.st_uid != os.geteuid():
        raise Refused(f"belongs to uid {info.st_uid}; pump writes only a new file or one of your own")


def check(path: str):
    """Refused if what is at path now may not be replaced (nothing there is fine)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    _refuse_unsafe(info)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class AtomicOutput(io.FileIO):
    """A new file beside the path (mode 0666 less the umask, as open() makes), renamed
    over it at close(); discard() (or an exception in a with block, or being dropped
    unclosed) removes it instead. write() writes everything it is given."""

    def __init__(self, path: str):
        path = os.fspath(path)
        check(path)
        directory, name = os.path.split(path)
        fd, self.temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=directory or ".")
        try:
            os.fchmod(fd, 0o666 & ~_umask())
        except BaseException:
            os.close(fd)
            os.unlink(self.temp)
            raise
        super().__init__(fd, "wb", closefd=True)
        self.path = path

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += super().write(view[done:])
        return done

    def close(self):
        """Complete: the path now holds what was written."""
        if self.closed:
            return
        super().close()
        try:
            check(self.path)  # again: something may have been put there meanwhile
            os.rename(self.temp, self.path)
        except BaseException:
            os.unlink(self.temp)
            raise

    def discard(self):
        """Abandon: the path keeps what it held before."""
        if not self.closed:
            super().close()
            try:
                os.unlink(self.temp)
            except FileNotFoundError:
                pass

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.discard()
        else:
            self.close()

    def __del__(self):
        self.discard()


class _GzipOutput(gzip.GzipFile):
    """gzip onto an AtomicOutput: close() completes both, discard() abandons both."""

    def __init__(self, path: str):
        self.output = AtomicOutput(path)
        super().__init__(filename=path, mode="wb", fileobj=self.output, mtime=0)  # mtime 0: same bytes

    def close(self):
        try:
            super().close()
        except BaseException:
            self.output.discard()
            raise
        self.output.close()

    def discard(self):
        self.output.discard()
        self.fileobj = None  # nothing more is written; GzipFile.close() then does nothing

    def __exit__(self, kind, value, tb):
        if kind is not None:
            self.discard()
        else:
            self.close()


def open_output(path: str, compress: bool = False):
    """A binary file written at once (see AtomicOutput), gzip-compressed with compress;
    opened now, so a path that cannot be written fails before any work. OSError says
    why not."""
    return _GzipOutput(path) if compress else AtomicOutput(path)


def open_in_place(path: str) -> int:
    """A descriptor for writing path from its start, kept there (a file that grows
    while a job runs): a new file, or a regular file of the caller's own emptied only
    after that check; never a link followed. OSError says why not."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    try:
        _refuse_unsafe(os.fstat(fd))
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
