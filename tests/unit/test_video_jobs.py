"""The video job store: files on disk, restart rule, listing, expiry."""

from __future__ import annotations

import json
import time

from omni.api.video_jobs import VideoJob, VideoStore


def job(**kw):
    return VideoJob(model="wan", prompt="a fox", seconds="1", size="32x32", **kw)


def test_finished_jobs_survive_a_restart_and_unfinished_ones_fail(tmp_path):
    store = VideoStore(tmp_path, retention_s=3600)
    store.open()
    done, running, queued = job(), job(), job()
    for j in (done, running, queued):
        store.add(j)
    running.status = "in_progress"
    store.save(running)
    store.finish(done, b"mp4 bytes", b"jpeg bytes")

    again = VideoStore(tmp_path, retention_s=3600)
    again.open()
    assert again.get(done.id).status == "completed"
    assert again.path(done, "mp4").read_bytes() == b"mp4 bytes"
    for j in (running, queued):
        reloaded = again.get(j.id)
        assert reloaded.status == "failed"
        assert reloaded.error["code"] == "server_restarted"
        assert "create it again" in reloaded.error["message"]
        # the failure is written back, not only decided in memory
        assert json.loads(again.path(j, "json").read_text())["status"] == "failed"


def test_unreadable_records_and_temp_files_are_skipped(tmp_path):
    store = VideoStore(tmp_path, retention_s=3600)
    store.open()
    good = job()
    store.add(good)
    (store.dir / "video_broken.json").write_text("{not json")
    (store.dir / ".tmp-leftover").write_bytes(b"half")
    again = VideoStore(tmp_path, retention_s=3600)
    again.open()
    assert list(again.jobs) == [good.id]
    assert not (store.dir / ".tmp-leftover").exists()


def test_listing_pages_with_the_after_cursor(tmp_path):
    store = VideoStore(tmp_path, retention_s=3600)
    store.open()
    jobs = [job(created_at=100 + i) for i in range(5)]
    for j in jobs:
        store.add(j)
    page, more = store.listing(None, 2, "asc")
    assert [j.id for j in page] == [jobs[0].id, jobs[1].id] and more
    page, more = store.listing(jobs[1].id, 10, "asc")
    assert [j.id for j in page] == [j.id for j in jobs[2:]] and not more
    page, _ = store.listing(None, 1, "desc")
    assert page[0].id == jobs[-1].id
    assert store.listing("video_unknown", 10, "asc") == ([], False)


def test_expired_videos_and_their_files_are_deleted(tmp_path):
    store = VideoStore(tmp_path, retention_s=0)
    store.open()
    j = job()
    store.add(j)
    store.finish(j, b"mp4", b"jpg")
    time.sleep(0.01)
    assert store.listing(None, 10, "asc") == ([], False)
    assert not any(store.dir.iterdir())


def test_delete_removes_every_file(tmp_path):
    store = VideoStore(tmp_path, retention_s=3600)
    store.open()
    j = job()
    store.add(j)
    store.finish(j, b"mp4", b"jpg")
    store.delete(j)
    assert store.get(j.id) is None and not any(store.dir.iterdir())
