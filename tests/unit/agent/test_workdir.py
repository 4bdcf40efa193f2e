"""The agent's job directories: the one safe reader of what a child leaves there (no link
followed, nothing that blocks, regular files only, never more than the cap + 1 byte), and the
removal of directories that dead agents left behind (never a live one's, never another
user's)."""

import fcntl
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
from jobqueue_client.child import RESULT_FILE_MAX_BYTES, run_child
from jobqueue_client.jobspec import JobSpec
from jobqueue_client.workdir import ChildFileError, JobDir, read_child_file, remove_stale_dirs

CAP = 1000


@pytest.fixture
def jobdir(tmp_path):
    d = JobDir(str(tmp_path))
    yield d
    d.close()


def read(d: JobDir, name="result.json", cap=CAP):
    """read_child_file on a thread, so that a reader that blocks fails the test instead of
    hanging it."""
    box = {}

    def target():
        try:
            box["value"] = d.read(name, cap)
        except ChildFileError as exc:
            box["error"] = str(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout=5)
    assert not t.is_alive(), "the reader blocked"
    return box


# --- the reader ------------------------------------------------------------------------------


def test_reads_a_regular_file_up_to_the_cap(jobdir):
    path = jobdir.file("result.json")
    assert read(jobdir) == {"value": None}  # no file: no result, no error
    with open(path, "wb") as fh:
        fh.write(b"x" * CAP)
    assert read(jobdir) == {"value": b"x" * CAP}
    with open(path, "ab") as fh:
        fh.write(b"y")
    assert read(jobdir) == {"error": f"is larger than {CAP} bytes"}


def test_a_huge_file_is_refused_without_reading_it(jobdir):
    with open(jobdir.file("result.json"), "wb") as fh:
        fh.truncate(64 * 1024**3)  # sparse: 64 GiB that take no disk
    started = time.monotonic()
    assert read(jobdir, cap=RESULT_FILE_MAX_BYTES) == {
        "error": f"is larger than {RESULT_FILE_MAX_BYTES} bytes"}
    assert time.monotonic() - started < 2


def test_a_fifo_is_refused_at_once(jobdir):
    os.mkfifo(jobdir.file("result.json"))
    assert read(jobdir) == {"error": "is a named pipe (fifo), not a regular file"}


def test_links_are_never_followed(jobdir, tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"stolen": true}')
    os.symlink("/dev/zero", jobdir.file("result.json"))
    os.symlink(outside, jobdir.file("other.json"))
    os.symlink("nowhere", jobdir.file("dangling.json"))
    for name in ("result.json", "other.json", "dangling.json"):
        assert read(jobdir, name) == {"error": "is a symbolic link, not a regular file"}


def test_directories_sockets_and_devices_are_refused(jobdir):
    os.mkdir(jobdir.file("result.json"))
    assert read(jobdir) == {"error": "is a directory, not a regular file"}
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(jobdir.file("sock"))
        assert read(jobdir, "sock") == {"error": "is a socket, not a regular file"}
    finally:
        sock.close()
    if os.geteuid() == 0:  # only root may make a device node
        os.mknod(jobdir.file("zero"), 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        assert read(jobdir, "zero") == {"error": "is a character device, not a regular file"}


def test_the_reader_reads_what_the_directory_holds_not_what_the_path_names(tmp_path):
    """The directory is held open: a child that moves it away and puts a link to something
    else at its path is not followed there."""
    d = JobDir(str(tmp_path))
    try:
        with open(d.file("result.json"), "w") as fh:
            fh.write("1")
        moved = tmp_path / "moved"
        os.rename(d.path, moved)
        decoy = tmp_path / "decoy"
        decoy.mkdir()
        (decoy / "result.json").write_text("2")
        os.symlink(decoy, d.path)
        assert read(d) == {"value": b"1"}
    finally:
        d.close()
        assert os.path.lexists(tmp_path / "decoy" / "result.json")  # not followed either


def test_read_child_file_takes_any_directory_fd(tmp_path):
    (tmp_path / "a").write_bytes(b"abc")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert read_child_file(fd, "a", 3) == b"abc"
        with pytest.raises(ChildFileError, match="larger than 2 bytes"):
            read_child_file(fd, "a", 2)
    finally:
        os.close(fd)


# --- the child's result through run_child ----------------------------------------------


def sh(script, timeout=None):
    return JobSpec(command=["sh", "-c", script], env={}, timeout_seconds=timeout)


def run(spec):
    started = time.monotonic()
    out = run_child(spec, job_id="job-1", attempt=1, context={}, stop=threading.Event(),
                    kill_grace=0.5)
    return out, time.monotonic() - started


@pytest.mark.parametrize(
    "script, first_line",
    [
        ('mkfifo "$JOB_RESULT_FILE"; exit 0',
         "JOB_RESULT_FILE is a named pipe (fifo), not a regular file"),
        ('mkdir "$JOB_RESULT_FILE"', "JOB_RESULT_FILE is a directory, not a regular file"),
        ('echo \'{"x": 1}\' > ../elsewhere.json; ln -s "$PWD/../elsewhere.json" '
         '"$JOB_RESULT_FILE"', "JOB_RESULT_FILE is a symbolic link, not a regular file"),
        (f'head -c {RESULT_FILE_MAX_BYTES + 1} /dev/zero > "$JOB_RESULT_FILE"',
         f"JOB_RESULT_FILE is larger than {RESULT_FILE_MAX_BYTES} bytes"),
        ('python3 -c "print(\'[\' * 100000)" > "$JOB_RESULT_FILE"',
         "JOB_RESULT_FILE is not valid JSON (RecursionError)"),
    ],
)
def test_a_result_file_that_is_not_a_small_regular_file_fails_the_job(script, first_line,
                                                                      tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    out, took = run(sh(script, timeout=5))
    assert out.returncode == 0 and not out.succeeded and out.result is None
    assert out.message().splitlines()[0] == first_line
    assert took < 4  # at once, not at the timeout
    assert [p.name for p in tmp_path.iterdir()] in ([], ["elsewhere.json"])


def test_a_fifo_result_and_a_lingering_writer_do_not_wedge_the_job(tmp_path, monkeypatch):
    """The child leaves a fifo and a process outside its group that keeps stdout open: the
    outcome is ready within the agent's bounded wait for the output."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    pidfile = tmp_path / "escaped.pid"
    script = (f'mkfifo "$JOB_RESULT_FILE"; setsid sh -c \'echo $$ > {pidfile}; '
              'while :; do echo tick; sleep 0.05; done\' & sleep 0.3; exit 0')
    try:
        out, took = run(sh(script))
        assert took < 8
        assert out.message().splitlines()[0] == (
            "JOB_RESULT_FILE is a named pipe (fifo), not a regular file")
        assert "tick" in out.output_tail
    finally:
        if pidfile.exists():
            os.killpg(int(pidfile.read_text()), 9)


# --- job directories and their stale remains ------------------------------------------


def test_a_job_dir_is_private_named_for_its_agent_and_locked(tmp_path):
    d = JobDir(str(tmp_path))
    try:
        name = os.path.basename(d.path)
        assert name.startswith(f"jobqueue-job-{os.getuid()}-{os.getpid()}-")
        assert stat.S_IMODE(os.stat(d.path).st_mode) == 0o700
        d.write_private("context.json", b"{}")
        assert stat.S_IMODE(os.stat(d.file("context.json")).st_mode) == 0o600
        with pytest.raises(FileExistsError):
            d.write_private("context.json", b"{}")
        fd = os.open(d.file(".lock"), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        d.close()
    assert list(tmp_path.iterdir()) == []


def test_closing_removes_what_a_child_locked_away(tmp_path):
    d = JobDir(str(tmp_path))
    os.makedirs(d.file("a/b"))
    (tmp_path / os.path.basename(d.path) / "a" / "b" / "f").write_text("x")
    os.mkfifo(d.file("fifo"))
    os.chmod(d.file("a/b"), 0)
    os.chmod(d.file("a"), 0o500)
    d.close()
    assert list(tmp_path.iterdir()) == []


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stale_dir(base, pid, uid=None, lock=True):
    path = base / f"jobqueue-job-{os.getuid() if uid is None else uid}-{pid}-abc123"
    path.mkdir(mode=0o700)
    (path / "context.json").write_text('{"secret": 1}')
    if lock:
        (path / ".lock").touch()
    return path


def test_stale_dirs_of_dead_agents_are_removed(tmp_path):
    locked_by_nobody = stale_dir(tmp_path, dead_pid())
    without_lock_file = stale_dir(tmp_path, dead_pid(), lock=False)  # the dead pid decides
    assert remove_stale_dirs(str(tmp_path)) == 2
    assert not locked_by_nobody.exists() and not without_lock_file.exists()
    assert remove_stale_dirs(str(tmp_path)) == 0


def test_live_and_foreign_dirs_are_kept(tmp_path):
    # A live agent in another process: its pid runs and it holds its lock.
    agent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from jobqueue_client.workdir import JobDir; d = JobDir(sys.argv[1]); "
         "print(d.path, flush=True); sys.stdin.read(); d.close()", str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    orphan = None
    try:
        live = agent.stdout.readline().strip()
        # A dead agent's orphaned child still holds the lock: kept until it ends.
        orphan_dir = stale_dir(tmp_path, dead_pid())
        orphan = subprocess.Popen(
            [sys.executable, "-c",
             "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
             "fcntl.flock(fd, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
             str(orphan_dir / ".lock")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert orphan.stdout.readline().strip() == "locked"
        # The pid in the name still runs, lock or not (an agent setting its directory up).
        setting_up = stale_dir(tmp_path, agent.pid, lock=False)
        # Another user's, by name; a link dressed up as a job directory; this process's own.
        other_user = stale_dir(tmp_path, dead_pid(), uid=os.getuid() + 1)
        target = tmp_path / "target"
        target.mkdir()
        (target / "keep").touch()
        os.symlink(target, tmp_path / f"jobqueue-job-{os.getuid()}-{dead_pid()}-link")
        mine = JobDir(str(tmp_path))
        kept = [live, orphan_dir, setting_up, other_user, target / "keep", mine.path]
        if os.geteuid() == 0:  # another user's, by owner
            owned_by_other = stale_dir(tmp_path, dead_pid())
            os.chown(owned_by_other, 65534, 65534)
            kept.append(owned_by_other)

        assert remove_stale_dirs(str(tmp_path)) == 0
        for path in kept:
            assert os.path.exists(path), path

        orphan.stdin.close()
        orphan.wait(timeout=10)
        assert remove_stale_dirs(str(tmp_path)) == 1
        assert not orphan_dir.exists()
        mine.close()
    finally:
        agent.stdin.close()
        agent.wait(timeout=10)
        if orphan is not None and orphan.poll() is None:
            orphan.kill()
    assert not os.path.exists(live)  # closed by its agent
    assert remove_stale_dirs(str(tmp_path)) == 1  # its pid is gone now
    assert not setting_up.exists()


def test_an_artifact_is_read_as_the_size_it_had_when_opened(tmp_path, monkeypatch):
    import errno as errno_mod

    from jobqueue_client.workdir import ChildFileError, JobDir

    with JobDir(str(tmp_path)) as jobdir:
        path = os.path.join(jobdir.file("artifacts"), "a.bin")
        with open(path, "wb") as fh:
            fh.write(b"x" * 100_000)
        assert jobdir.artifact_names() == ["a.bin"]
        with jobdir.open_artifact("a.bin", 200_000) as f:
            with open(path, "ab") as fh:
                fh.write(b"grown")  # after it was opened: not read
            assert b"".join(f.chunks(30_000)) == b"x" * 100_000
        f.close()  # twice is fine
        with jobdir.open_artifact("a.bin", 200_000) as f:
            os.truncate(path, 10)
            with pytest.raises(ChildFileError, match="shrank while it was read"):
                b"".join(f.chunks())
        with pytest.raises(ChildFileError, match="is gone"):
            jobdir.open_artifact("missing", 10)
        with jobdir.open_artifact("a.bin", 200_000) as f:
            def fail(fd, n):
                raise OSError(errno_mod.EIO, "Input/output error")

            monkeypatch.setattr(os, "read", fail)
            with pytest.raises(ChildFileError, match="could not be read"):
                next(f.chunks())
