"""A job's private directory, and the one way the agent reads what the child left in it.

Each job runs in its own directory under the temporary directory (TMPDIR, else /tmp):

    jobqueue-job-<uid>-<pid>-<random>/     mode 0700, made by the agent with that pid
        .lock                              flock()ed while the job's processes live
        context.json                       dispatch_context, mode 0600
        result.json                        written by the child, if it likes
        artifacts/                         JOB_ARTIFACTS_DIR: files uploaded on success

The agent removes the directory when the job ends. If the agent dies first (SIGKILL, a power
cut), the directory would stay behind with the secret in it, so every agent, when it starts
and now and then while it runs, removes the stale ones: those named for its own uid, owned by
it, whose lock nobody holds (flock dies with the last process that holds it: the agent and
the job's child, which inherits the lock) and whose agent pid no longer runs. A live agent's
or a still-running orphaned child's directory is never touched, nor another user's.

Files the child leaves are read by `read_child_file` only: no link is followed
(O_NOFOLLOW), nothing blocks (O_NONBLOCK: a fifo cannot wedge the agent), only a regular file
is read, and never more than its cap + 1 byte (so /dev/zero or a huge file cannot exhaust
memory). Artifacts (files in JOB_ARTIFACTS_DIR) are opened by the same rules (ChildFile)
and streamed, never read whole. Whatever is wrong comes back as ChildFileError with a
one-line reason.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile

PREFIX = "jobqueue-job-"
LOCK_NAME = ".lock"
ARTIFACTS_DIR = "artifacts"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-[A-Za-z0-9_-]+$")
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (fifo)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symbolic link",
}


class ChildFileError(Exception):
    """A file in the job directory that the agent refuses to read; str() is the reason."""


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def _open_child_file(dir_fd: int, name: str, max_bytes: int) -> tuple[int, int] | None:
    """(an fd opened for reading, its size) of the regular file `name` in `dir_fd`, None when
    there is no such file; ChildFileError for anything else (see read_child_file)."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ChildFileError(f"could not be read ({exc.strerror})") from None
    # Look before opening: opening a device or a fifo can have effects of its own.
    if not stat.S_ISREG(before.st_mode):
        raise ChildFileError(f"is {_kind(before.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    # The name swapped or removed since the stat above (a race with the child), or refused
    # (a permission the tests' root user is never refused):
    except FileNotFoundError:  # pragma: no cover -- race (above)
        return None
    except OSError as exc:  # pragma: no cover -- race or permission (above)
        if exc.errno == errno.ELOOP:  # swapped for a link since we looked
            raise ChildFileError("is a symbolic link, not a regular file") from None
        raise ChildFileError(f"could not be read ({exc.strerror})") from None
    try:
        st = os.fstat(fd)  # what was opened, whatever the name points at by now
        if not stat.S_ISREG(st.st_mode):  # pragma: no cover -- race: swapped since the stat
            raise ChildFileError(f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise ChildFileError(f"is larger than {max_bytes} bytes")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def read_child_file(dir_fd: int, name: str, max_bytes: int) -> bytes | None:
    """The content of `name` in the directory `dir_fd`, None when there is no such file.

    Raises ChildFileError when it is not a regular file (a symbolic link, a fifo, a device,
    a directory...), is larger than `max_bytes`, or cannot be read."""
    opened = _open_child_file(dir_fd, name, max_bytes)
    if opened is None:
        return None
    fd, _size = opened
    try:
        chunks, size = [], 0
        while size <= max_bytes:  # a file still growing is read up to the cap + 1 byte
            chunk = os.read(fd, min(65536, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ChildFileError(f"is larger than {max_bytes} bytes")
        return b"".join(chunks)
    except OSError as exc:
        raise ChildFileError(f"could not be read ({exc.strerror})") from None
    finally:
        os.close(fd)


class ChildFile:
    """A regular file the child left, opened by the same rules as read_child_file, read as
    `size` bytes in pieces (what it grows by after it was opened is not read)."""

    def __init__(self, dir_fd: int, name: str, max_bytes: int):
        opened = _open_child_file(dir_fd, name, max_bytes)
        if opened is None:
            raise ChildFileError("is gone")
        self.name = name
        self.fd, self.size = opened

    def chunks(self, piece: int = 65536):
        left = self.size
        while left > 0:
            try:
                data = os.read(self.fd, min(piece, left))
            except OSError as exc:
                raise ChildFileError(f"could not be read ({exc.strerror})") from None
            if not data:  # shrunk since it was opened: the upload's length no longer holds
                raise ChildFileError("shrank while it was read")
            left -= len(data)
            yield data

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ChildFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def base_dir() -> str:
    """Where job directories live: TMPDIR (else /tmp; Python's tempfile rules)."""
    return tempfile.gettempdir()


class JobDir:
    """A job's private directory (0700), locked for as long as the job's processes live.

    `lock_fd` is meant to be passed to the child (subprocess pass_fds), so that the lock is
    held while the child runs even if the agent dies."""

    def __init__(self, base: str | None = None):
        uid, pid = os.getuid(), os.getpid()
        self.path = tempfile.mkdtemp(prefix=f"{PREFIX}{uid}-{pid}-", dir=base)
        self.dir_fd = -1
        self.lock_fd = -1
        self.artifacts_fd = -1
        try:
            self.dir_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC)
            self.lock_fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL
                                   | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.dir_fd)
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # JOB_ARTIFACTS_DIR: opened now, so that what the agent lists later is this
            # directory even if the child puts something else (a link) at its name.
            os.mkdir(ARTIFACTS_DIR, 0o700, dir_fd=self.dir_fd)
            self.artifacts_fd = os.open(ARTIFACTS_DIR, os.O_RDONLY | os.O_DIRECTORY
                                        | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        # (A directory mkdtemp() just made, 0700 and ours: no step above fails but for a
        # signal or an exhausted fd table.)
        except BaseException:  # pragma: no cover -- cannot fail (above)
            self.close()
            raise

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def write_private(self, name: str, data: bytes) -> str:
        """Create `name` (mode 0600, never an existing file or link) holding `data`."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self.dir_fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return self.file(name)

    def read(self, name: str, max_bytes: int) -> bytes | None:
        return read_child_file(self.dir_fd, name, max_bytes)

    def artifact_names(self) -> list[str]:
        """What the child left in JOB_ARTIFACTS_DIR, by name (each one is then opened with
        open_artifact, which refuses all but regular files)."""
        return sorted(os.listdir(self.artifacts_fd))

    def open_artifact(self, name: str, max_bytes: int) -> ChildFile:
        return ChildFile(self.artifacts_fd, name, max_bytes)

    def close(self) -> None:
        """Remove the directory and everything in it, then let go of the lock."""
        if self.path:
            _rmtree(self.path)
        for fd in (self.artifacts_fd, self.dir_fd, self.lock_fd):
            if fd >= 0:
                os.close(fd)
        self.dir_fd = self.lock_fd = self.artifacts_fd = -1
        self.path = ""

    def __enter__(self) -> JobDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _rmtree(path: str) -> None:
    """shutil.rmtree (which never follows a link) that also gets through what a child may
    leave behind: directories it took the permissions away from."""

    def unlock_and_retry(func, failed, _exc):
        try:
            for target in (os.path.dirname(failed), failed):
                if stat.S_ISDIR(os.lstat(target).st_mode):
                    os.chmod(target, 0o700)
            # (Only what root cannot remove fails twice: the tests run as root.)
            if stat.S_ISDIR(os.lstat(failed).st_mode):  # pragma: no cover -- see above
                shutil.rmtree(failed, ignore_errors=True)
            else:
                func(failed)
        except OSError:  # pragma: no cover -- root removes anything (above)
            pass  # best effort: what cannot be removed stays

    handler = {"onexc" if sys.version_info >= (3, 12) else "onerror": unlock_and_retry}
    try:
        shutil.rmtree(path, **handler)
    except OSError:  # pragma: no cover -- the handler takes every error
        pass


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # pragma: no cover -- another user's process; tests run as root
        return False
    return False


def remove_stale_dirs(base: str | None = None) -> int:
    """Remove the job directories this user's dead agents left behind; returns how many.

    A directory goes only when its name says it was made for this uid, it is a real directory
    owned by this uid, the agent pid in its name no longer runs, and its lock can be taken
    (no process of the job is alive). The lock is held while the directory is removed, so two
    agents starting at once do not trip over each other."""
    base = base or base_dir()
    uid = os.getuid()
    removed = 0
    try:
        names = os.listdir(base)
    except OSError:
        return 0
    for name in names:
        match = _NAME.match(name)
        if not match or int(match.group(1)) != uid or int(match.group(2)) == os.getpid():
            continue
        if not _pid_gone(int(match.group(2))):
            continue
        path = os.path.join(base, name)
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        lock_fd = -1
        try:
            if os.fstat(dir_fd).st_uid != uid:
                continue
            try:
                lock_fd = os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK
                                  | os.O_CLOEXEC, dir_fd=dir_fd)
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except FileNotFoundError:
                pass  # no lock file (removed by the child?): the dead pid is enough
            except OSError:
                continue  # held: a process of that job still runs
            _rmtree(path)
            removed += 1
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)
            os.close(dir_fd)
    return removed
