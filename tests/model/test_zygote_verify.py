"""Who hashes an artifact before a zygote loads it: the front-end has, for the list a zygote
starts or rolls onto, so that zygote does not hash it again; a zygote that replaces a dead one
does, since the files may have changed since. Real zygote processes, on a copy of the default
artifact whose manifest no longer matches its files."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ringserve.service.config.settings import Config
from ringserve.service.pool.forker import Forker
from ringserve.workers.process.zygote import Zygote
from ringserve.workers.spec import ModelRef

from devkit.repository import break_fingerprint

DEADLINE_S = 60.0  # a zygote's boot: about a second here, more on a loaded machine


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory, default_model: str) -> str:
    copy = tmp_path_factory.mktemp("zv") / "broken"
    copy.mkdir()
    for f in Path(default_model).iterdir():  # the weights linked, the manifest copied and edited
        if f.name == "manifest.json":
            shutil.copy(f, copy / f.name)
        else:
            (copy / f.name).symlink_to(f)
    return str(break_fingerprint(copy))


def settled(zygote: Zygote) -> bool:
    """The zygote is ready, or dead (it refused its list)."""
    deadline = time.monotonic() + DEADLINE_S
    while not zygote.poll():
        if zygote.dead or zygote.process.exitcode is not None:
            return False
        assert time.monotonic() < deadline, f"the zygote neither started nor died in {DEADLINE_S} s"
        time.sleep(0.01)
    return True


@pytest.fixture
def zygotes() -> Iterator[Callable[..., Zygote]]:
    made: list[Zygote] = []

    def make(*args: Any, **kwargs: Any) -> Zygote:
        made.append(Zygote(*args, **kwargs))
        return made[-1]

    yield make
    for z in made:
        z.close()


def test_a_zygote_hashes_its_artifacts_only_when_asked(
    broken: str, zygotes: Callable[..., Zygote]
) -> None:
    assert not settled(zygotes(broken, 1, False, verify=True))  # fingerprint mismatch: it exits
    assert settled(zygotes(broken, 1, False, verify=False))


def test_the_forker_verifies_only_for_a_zygote_that_replaces_a_dead_one(default_model: str) -> None:
    events: list[str] = []
    now = [0.0]  # the forker's clock: its retry back-off is waited out by moving it
    forker = Forker(
        Config(),
        (ModelRef(0, "sst2", 1, default_model),),
        default_model,
        False,
        lambda: now[0],
        lambda event, **_: events.append(event),
    )
    try:
        forker.tend(0)  # the start: the front-end verified the artifact
        assert forker.zygote is not None and forker.zygote.verify is False
        forker.replace("died", 0)  # before its retry time: nothing yet
        assert forker.zygote is None
        now[0] += 600.0
        forker.tend(0)
        assert forker.zygote is not None and forker.zygote.verify is True
        forker.reload(1)  # a load or reload: verified again by the front-end first
        assert forker.zygote is not None and forker.zygote.verify is False
        assert forker.zygote.generation == 1
    finally:
        forker.close()
    assert events == [
        "zygote_started",
        "zygote_replaced",
        "zygote_started",
        "zygote_replaced",
        "zygote_started",
    ]
