"""The sandbox's plan (engine/process/sandbox_plan.py): the policy resolved against the filesystem as it is, into the
steps every executor carries out as given (engine/process/sandbox_mounts.py, engine/process/native/spare.c)."""

from __future__ import annotations

import os

from engine.process.sandbox_plan import BIND, COVER, MASK, MOUNT_POINT, PRIVATE, READ_ONLY, SEAL, view_plan


def test_what_exists_is_covered_once_and_files_are_masked_in_the_first_cover(tmp_path):
    outer, inner, other = tmp_path / "outer", tmp_path / "outer" / "inner", tmp_path / "other"
    inner.mkdir(parents=True)
    other.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("s")
    (tmp_path / "link").symlink_to(other)
    conceal = [str(p) for p in (outer, inner, secret, tmp_path / "missing", tmp_path / "link", other)]
    steps = view_plan(str(other), conceal, 0)  # the home, named as well: covered once
    assert steps == ((COVER, str(outer)), (COVER, str(other)), (MASK, str(secret), str(outer)), (READ_ONLY,))


def test_what_a_private_tmpfs_hides_is_not_covered_again(tmp_path):
    """tmp_path lies in /tmp, which the hook gets as a private tmpfs of its own: nothing below it is covered."""
    below_tmp = tmp_path / "dir"
    below_tmp.mkdir()
    steps = view_plan(None, [str(below_tmp)], 16)
    private = [(PRIVATE, path, 16) for path in ("/tmp", "/dev/shm") if os.path.isdir(path)]
    assert steps == ((READ_ONLY,), *private)


def test_with_nothing_covered_a_file_is_masked_in_the_private_tmp_and_sealed_after():
    steps = view_plan(None, ["/etc/passwd"], 16)
    assert steps[0] == (READ_ONLY,) and steps[1] == (PRIVATE, "/tmp", 16)
    assert steps[-2:] == ((MASK, "/etc/passwd", "/tmp"), (SEAL, "/etc/passwd"))


def test_a_launcher_under_a_cover_gets_its_mount_point_before_the_seal_and_is_bound_last(tmp_path):
    cover = tmp_path / "root"
    launcher = cover / ".pyenv" / "versions" / "3.12"
    launcher.mkdir(parents=True)
    steps = view_plan(None, [str(cover)], 0, launcher=(str(launcher), str(tmp_path / "gone")))
    assert steps == ((COVER, str(cover)), (MOUNT_POINT, str(launcher)), (READ_ONLY,),
                     (BIND, str(launcher), str(launcher), False))
