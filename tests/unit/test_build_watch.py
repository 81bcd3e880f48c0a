"""Who waits for a session hears of an image build it sets off (issue 32.6): inside
``watching_builds``, a build's progress reaches the watcher from its one-time-build announcement
on, an image found current says nothing to it, the log gets everything either way, and outside
the block nothing reaches the watcher. Pure logic."""

from __future__ import annotations

from orchestrator.images.progress import ONE_TIME_BUILD, watched, watching_builds
from tests.unit.test_download_tally import Lines


def run_a_build(progress: Lines, *, builds: bool) -> None:
    part = watched(progress)
    part.step("base image")
    part.log("sandhold-base:bookworm is current")
    part.done("base image")
    if builds:
        part.step(f"{ONE_TIME_BUILD} of template t: about 20 s")
        part.done(f"{ONE_TIME_BUILD} of template t: about 20 s")
        part.step("template image")
        part.log("Step 1/3")
        part.done("template image")


def test_the_watcher_hears_a_build_from_its_announcement_and_the_log_hears_all() -> None:
    log, watcher = Lines(), Lines()
    with watching_builds(watcher):
        run_a_build(log, builds=True)
    assert len(log.lines) == 8
    assert watcher.lines == [
        f"step {ONE_TIME_BUILD} of template t: about 20 s",
        f"done {ONE_TIME_BUILD} of template t: about 20 s",
        "step template image",
        "Step 1/3",
        "done template image",
    ]


def test_an_image_found_current_tells_the_watcher_nothing() -> None:
    log, watcher = Lines(), Lines()
    with watching_builds(watcher):
        run_a_build(log, builds=False)
    assert watcher.lines == [] and len(log.lines) == 3


def test_outside_the_block_nothing_reaches_the_watcher() -> None:
    log, watcher = Lines(), Lines()
    with watching_builds(watcher):
        pass
    run_a_build(log, builds=True)
    assert watcher.lines == [] and len(log.lines) == 8
