"""The job-directory reader and the directory itself at their edges: files whose reported
size lies (/proc), reads that fail, names the system refuses, and a directory closed twice or
used as a context manager. The main cases are in test_workdir.py."""

import os

import pytest
from jobqueue_client.workdir import ChildFileError, JobDir, read_child_file, remove_stale_dirs


@pytest.fixture
def proc_self():
    fd = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_file_that_is_bigger_than_it_says_is_still_capped(proc_self):
    """/proc files report size 0 and hold more: the reader stops at the cap + 1 byte."""
    assert os.stat("status", dir_fd=proc_self).st_size == 0
    with pytest.raises(ChildFileError, match="^is larger than 100 bytes$"):
        read_child_file(proc_self, "status", 100)
    assert b"Pid:" in read_child_file(proc_self, "status", 1 << 20)


def test_a_read_that_fails_is_a_reason_not_a_crash(proc_self):
    """/proc/self/mem is a regular file that cannot be read at offset 0 (EIO)."""
    with pytest.raises(ChildFileError, match=r"^could not be read \(Input/output error\)$"):
        read_child_file(proc_self, "mem", 100)


def test_a_name_the_system_refuses_is_a_reason(tmp_path):
    with JobDir(str(tmp_path)) as d:
        with pytest.raises(ChildFileError, match=r"^could not be read \(File name too long\)$"):
            d.read("x" * 300, 100)
        assert d.read("absent.json", 100) is None


def test_a_job_dir_as_a_context_manager_is_removed_and_closing_twice_is_harmless(tmp_path):
    with JobDir(str(tmp_path)) as d:
        path = d.path
        d.write_private("context.json", b"{}")
        assert os.path.isdir(path)
    assert not os.path.exists(path)
    assert (d.path, d.dir_fd, d.lock_fd) == ("", -1, -1)
    d.close()
    assert list(tmp_path.iterdir()) == []


def test_stale_dirs_under_a_missing_base_are_none(tmp_path):
    assert remove_stale_dirs(str(tmp_path / "missing")) == 0
