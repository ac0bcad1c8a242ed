"""What clusterctl trusts on a shared file system: a directory that is this user's alone, under directories no one
else can rename it out of (rundir/ownership.py). The stranger's side, with a second real user, is in test_access.py."""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.rundir.ownership import untrusted

ME = os.geteuid()
SOMEONE = ME + 4242  # a uid that is not this user's (the check reads owners, it does not ask the system)


def test_a_private_directory_of_ones_own_is_trusted(tmp_path: Path) -> None:
    mine = tmp_path / "runs"
    mine.mkdir(mode=0o700)
    assert untrusted(mine) is None
    assert untrusted(mine / "not-made-yet") is None  # judged by where it would be made


def test_a_directory_others_may_write_is_not_and_the_message_says_how_to_fix_it(tmp_path: Path) -> None:
    loose = tmp_path / "runs"
    loose.mkdir()
    loose.chmod(0o777)
    why = untrusted(loose)
    assert why is not None and str(loose) in why and "drwxrwxrwx" in why and f"chmod go-w {loose}" in why
    loose.chmod(0o775)  # group write is write by others too
    assert untrusted(loose) is not None


def test_a_directory_of_another_user_is_not_even_when_only_they_can_write_it(tmp_path: Path) -> None:
    theirs = tmp_path / "runs"
    theirs.mkdir(mode=0o700)
    why = untrusted(theirs, uid=SOMEONE)
    assert why is not None and "belongs to another user" in why


def test_a_parent_others_may_write_lets_them_swap_the_directory_unless_it_is_sticky(tmp_path: Path) -> None:
    shared = tmp_path / "scratch"
    shared.mkdir()
    mine = shared / "me"
    mine.mkdir(mode=0o700)
    shared.chmod(0o777)
    why = untrusted(mine)
    assert why is not None and "not sticky" in why and f"rename {mine} away" in why
    assert untrusted(mine / "checkpoints") is not None  # a path to be made there is no safer
    shared.chmod(0o1777)  # /tmp, or a site's root-owned per-user parent: others cannot rename what is ours
    assert untrusted(mine) is None


def test_a_link_is_judged_by_where_it_leads(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    link = tmp_path / "runs"
    link.symlink_to(loose)
    assert untrusted(link) is not None and str(loose) in untrusted(link)


def test_a_file_where_the_directory_should_be_is_refused_at_once(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    blocker.chmod(0o600)
    assert "is not a directory" in (untrusted(blocker) or "")
    assert "Not a directory" in (untrusted(blocker / "ckpt") or "")  # nothing could be made under it
