"""Video jobs on disk: one JSON record per job, its MP4 and thumbnail beside it.

Layout under the data directory: ``videos/<id>.json`` (the job), ``videos/<id>.mp4``,
``videos/<id>.jpg`` (first frame). Every write goes to a temp file renamed into place,
so a crash never leaves a half-written record or file that looks complete.

Restart rule: a job that was queued or running when the server stopped is marked
``failed`` with error code ``server_restarted`` at the next start (its request died
with the old process; resuming would need its engine state). Finished jobs and their
files survive restarts until they expire (``expires_at``, set by the retention), when
they are deleted at the next start or listing.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("omni.api.videos")

ACTIVE = ("queued", "in_progress")


@dataclass
class VideoJob:
    """A video job; ``api()`` is the OpenAI ``Video`` object."""

    model: str
    prompt: str
    seconds: str
    size: str
    id: str = field(default_factory=lambda: f"video_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: str = "queued"
    progress: int = 0
    completed_at: int | None = None
    expires_at: int | None = None
    error: dict[str, str] | None = None
    # ours, not OpenAI's: what ran, so any output can be reproduced
    frames: int = 0
    fps: int = 0
    seed: int | None = None
    steps: int | None = None

    def api(self) -> dict[str, Any]:
        return {"id": self.id, "object": "video", "created_at": self.created_at,
                "completed_at": self.completed_at, "expires_at": self.expires_at,
                "status": self.status, "progress": self.progress, "model": self.model,
                "prompt": self.prompt, "seconds": self.seconds, "size": self.size,
                "remixed_from_video_id": None, "error": self.error, "frames": self.frames,
                "fps": self.fps, "seed": self.seed, "steps": self.steps}


class VideoStore:
    """Jobs by id, persisted under ``root/videos``; the single owner of their files."""

    def __init__(self, root: str | os.PathLike, retention_s: float) -> None:
        self.dir = Path(root) / "videos"
        self.retention_s = retention_s
        self.jobs: dict[str, VideoJob] = {}

    def open(self) -> None:
        """Load the jobs on disk, fail the ones an earlier process left unfinished."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self.dir.glob("video_*.json")):
            try:
                job = VideoJob(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError) as e:
                log.warning("skipping unreadable video job %s: %s", path, e)
                continue
            if job.status in ACTIVE:
                job.status = "failed"
                job.error = {"code": "server_restarted", "message": (
                    "the server stopped before this video was finished; create it again")}
                self.save(job)
            self.jobs[job.id] = job
        for stale in self.dir.glob(".tmp-*"):  # leftovers of a crash mid-write
            stale.unlink(missing_ok=True)
        self.expire()
        log.info("video jobs: %d on disk under %s", len(self.jobs), self.dir)

    def add(self, job: VideoJob) -> None:
        self.jobs[job.id] = job
        self.save(job)

    def get(self, job_id: str) -> VideoJob | None:
        return self.jobs.get(job_id)

    def save(self, job: VideoJob) -> None:
        self._write(self.dir / f"{job.id}.json", json.dumps(asdict(job)).encode())

    def finish(self, job: VideoJob, mp4: bytes, thumbnail: bytes) -> None:
        """Files first, then the record: a completed record always has its files."""
        self._write(self.path(job, "mp4"), mp4)
        self._write(self.path(job, "jpg"), thumbnail)
        job.status, job.progress = "completed", 100
        job.completed_at = int(time.time())
        job.expires_at = job.completed_at + int(self.retention_s)
        self.save(job)

    def fail(self, job: VideoJob, code: str, message: str) -> None:
        job.status, job.error = "failed", {"code": code, "message": message}
        job.completed_at = int(time.time())
        self.save(job)

    def delete(self, job: VideoJob) -> None:
        self.jobs.pop(job.id, None)
        for suffix in ("mp4", "jpg", "json"):
            self.path(job, suffix).unlink(missing_ok=True)

    def path(self, job: VideoJob, suffix: str) -> Path:
        return self.dir / f"{job.id}.{suffix}"

    def expire(self) -> None:
        now = time.time()
        for job in [j for j in self.jobs.values() if j.expires_at and j.expires_at <= now]:
            self.delete(job)

    def listing(self, after: str | None, limit: int, order: str) -> tuple[list[VideoJob], bool]:
        """A page of jobs by creation time, after the cursor ``after`` (a job id)."""
        self.expire()
        jobs = sorted(self.jobs.values(), key=lambda j: (j.created_at, j.id),
                      reverse=order == "desc")
        if after is not None:
            ids = [j.id for j in jobs]
            jobs = jobs[ids.index(after) + 1:] if after in ids else []
        return jobs[:limit], len(jobs) > limit

    def active(self) -> int:
        return sum(1 for j in self.jobs.values() if j.status in ACTIVE)

    def _write(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def default_data_dir() -> Path:
    """``$OMNI_DATA_DIR``, else ``$XDG_DATA_HOME/omni``, else ~/.local/share/omni."""
    if os.environ.get("OMNI_DATA_DIR"):
        return Path(os.environ["OMNI_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "omni"
