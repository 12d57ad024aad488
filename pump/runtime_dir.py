"""The per-user runtime directory where a user's own pumpd lives (socket, lock, jobs).

pumpd, pump-run and `pump status` all find it here, so they agree on one place, and
none of them ever uses a directory another user could have made: a directory is used
only when lstat() shows a real directory (not a symlink) owned by the effective uid
with mode exactly 0700.  $XDG_RUNTIME_DIR/pump when $XDG_RUNTIME_DIR passes that check
itself (systemd-logind makes it so) and the socket's path there fits an AF_UNIX address,
else /tmp/pump-<uid>, created 0700 if absent and
refused with a clear error otherwise (another user can pre-create it: issue 18 item 6).

A daemon is shared only within one uid, one pid namespace and one boot: the directory
returned has a subdirectory named after the boot id and the pid namespace's inode, so a
container or a reboot (with a persistent /tmp) never finds another's daemon.
"""

import os
import stat
import tempfile

SOCKET_NAME = "pumpd.sock"
SOCKET_PATH_MAX = 107  # sun_path's 108 bytes, less the NUL that ends the path


class RuntimeDirError(Exception):
    """A runtime directory that cannot be trusted or made; str() says which and why."""


class RuntimeDirMissing(RuntimeDirError):
    """A runtime directory that does not exist (and was not to be made): nothing refused."""


def check_private_dir(path: str, create: bool = True) -> str:
    """path if it is a directory of our own, mode 0700 (made so if absent and create);
    RuntimeDirError otherwise.  lstat: a symlink is refused, never followed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not create:
            raise RuntimeDirMissing(f"{path} does not exist") from None
        try:
            os.mkdir(path, 0o700)  # the umask can only take bits away
        except FileExistsError:
            pass  # made meanwhile: the checks below decide
        except OSError as exc:
            raise RuntimeDirError(f"cannot create {path}: {exc.strerror}") from None
        st = os.lstat(path)
    problems = []
    if stat.S_ISLNK(st.st_mode):
        problems.append("it is a symbolic link")
    elif not stat.S_ISDIR(st.st_mode):
        problems.append("it is not a directory")
    if st.st_uid != os.geteuid():
        problems.append(f"it belongs to uid {st.st_uid}, not {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        problems.append(f"its mode is {stat.S_IMODE(st.st_mode):04o}, not 0700")
    if problems:
        raise RuntimeDirError(f"refusing {path}: {', '.join(problems)} (remove it, or set "
                              "XDG_RUNTIME_DIR to a directory of yours with mode 0700)")
    return path


def scope() -> str:
    """The boot and pid namespace this process runs in, as a directory name."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    return f"{boot[:8]}-{os.stat('/proc/self/ns/pid').st_ino}"


def base_dir() -> str:
    """$XDG_RUNTIME_DIR/pump when $XDG_RUNTIME_DIR is ours with mode 0700, else /tmp/pump-<uid>;
    that too where the socket's path under $XDG_RUNTIME_DIR would not fit an AF_UNIX address
    (pumpd could not bind it: "AF_UNIX path too long")."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and len(os.fsencode(os.path.join(xdg, "pump", scope(), SOCKET_NAME))) <= SOCKET_PATH_MAX:
        try:
            check_private_dir(xdg, create=False)
            return os.path.join(xdg, "pump")
        except RuntimeDirError:
            pass  # not ours or not private: the checked /tmp fallback
    return os.path.join(tempfile.gettempdir(), f"pump-{os.geteuid()}")


def user_runtime_dir(create: bool = True) -> str:
    """The checked directory of this user's pumpd in this boot and pid namespace."""
    return check_private_dir(os.path.join(check_private_dir(base_dir(), create), scope()), create)


def user_socket(create: bool = True) -> str:
    return os.path.join(user_runtime_dir(create), SOCKET_NAME)
