"""`HubPushCallback`: pushes during training that never hold training up.

The trainer calls ``on_save(trainer, ckpt_dir, is_best)`` on the main process right after a checkpoint is
committed. It exports the checkpoint into ``RUN/hub/step_N`` at once (in the caller's thread: a checkpoint
that keep_last prunes later is never lost to the upload) and hands the folder to one upload thread
through a queue of ONE waiting export: a newer export replaces the one still waiting (the newest wins; the
superseded folder is deleted), so a slow or unreachable Hub costs training the export only, never the
upload. A failed upload is retried with a backoff that a newer export interrupts; an outage is one
warning line when it starts and one when it ends, not a line per retry. Staged exports that could not be
pushed are kept like checkpoints: the newest ``keep_last`` (the run's), older ones deleted.
``on_train_end`` waits for the last push at most ``hub_wait_s`` seconds, with a line saying so; what
was not pushed stays in ``RUN/hub`` for ``yxanul push``. The thread is a daemon: it never keeps the
process alive. Nothing here raises into the training loop.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from ..checkpoint import read_pointer
from ..errors import UserError, first_line
from . import push as hub_push  # its module attribute: tests swap default_api
from .export import export
from .loading import resolve_checkpoint
from .push import _step, upload


class HubPushCallback:
    def __init__(self, hub, run_dir: str | Path | None, api=None, say=print, retries: int = 3,
                 backoff_s: float = 10.0, keep_last: int = 2, open_s: float = 30.0):
        self.hub = hub
        self.run_dir = Path(run_dir) if run_dir is not None else None  # None: the trainer's, at train begin
        self.api, self.say, self.retries, self.backoff_s, self.keep_last = api, say, retries, backoff_s, keep_last
        self.open_s = open_s  # how long step 1 may wait for the Hub to answer `open_repo`
        self._opened = False
        self.pushed: list[str] = []   # commit urls
        self.failed: list[Path] = []  # staged folders whose upload failed, oldest first
        self._cond = threading.Condition()
        self._waiting: tuple[Path, str] | None = None  # the one export queued behind the upload in flight
        self._busy: Path | None = None                 # the folder being uploaded
        self._outage = False
        self._thread: threading.Thread | None = None
        self._running = False  # a worker is on its way to take what is waiting (set and cleared under _cond)

    def on_setup(self, trainer=None) -> None:
        """Before the run directory exists: the Hub client, so that an offline setup or a missing token is refused
        with nothing written (`default_api`); then the repository (`_open`)."""
        self.api = self.api or hub_push.default_api()
        if not self._opened:
            self._opened = True
            self._open()

    def on_train_begin(self, trainer) -> None:
        """The run's directory and keep_last (and `on_setup` for a caller that skipped it)."""
        if self.run_dir is None:
            self.run_dir = Path(trainer.run_dir)
        if trainer is not None and getattr(trainer, "cfg", None) is not None:
            self.keep_last = trainer.cfg.checkpoint.keep_last
        self.on_setup(trainer)

    def _open(self) -> None:
        """Create the repository (and branch) before step 1, as transformers' Trainer does (``init_hf_repo``):
        a token that may not write there is one line now instead of a warning after the first checkpoint. A
        Hub that fails otherwise, or does not answer in ``open_s`` seconds, is the outage's one warning: the
        pushes retry at each save, and training never waits on the Hub longer than that."""
        hub, outcome = self.hub, []

        def call() -> None:
            try:
                hub_push.open_repo(self.api, hub.hub_model_id, private=hub.hub_private, revision=hub.hub_revision)
            except Exception as e:  # noqa: BLE001 - decided below: refused, or an outage
                outcome.append(e)
            else:
                outcome.append(None)

        worker = threading.Thread(target=call, name="yxanul-hub-open", daemon=True)  # daemon: never holds the exit
        worker.start()
        worker.join(self.open_s)
        error = outcome[0] if outcome else TimeoutError(f"no answer in {self.open_s:g} s")
        if error is None:
            return
        if status := hub_push.refused_by_hub(error):
            raise UserError(f"push to the Hub: {hub.hub_model_id} cannot be created or written with this token "
                            f"(HTTP {status}: {first_line(error)}); use a token with write access "
                            f"(HF_TOKEN or `hf auth login`), or {hub_push.LATER}")
        self._outage = True  # the first push that succeeds says so
        self.say(f"warning: push to {hub.hub_model_id}: the Hub did not open the repository before training "
                 f"({type(error).__name__}: {first_line(error)}); training goes on, each save retries")

    @property
    def staging(self) -> Path:
        return self.run_dir / "hub"

    def on_save(self, trainer, ckpt_dir: str | Path, is_best: bool | None = None) -> None:
        """``is_best`` None: read the run's ``best`` pointer (save_checkpoint has just updated it)."""
        if is_best is None:
            best = read_pointer(self.run_dir, "best")
            is_best = best is not None and best.name == Path(ckpt_dir).name
        strategy = self.hub.hub_strategy
        if strategy == "every_save" or (strategy == "best" and is_best):
            self._push(Path(ckpt_dir), "Training in progress")

    def on_train_end(self, trainer=None) -> None:
        if self.hub.hub_strategy == "end":
            try:
                ckpt = resolve_checkpoint(self.run_dir)
            except UserError as e:
                self.say(f"warning: push to the Hub skipped: {e}")
                return
            self._push(ckpt, "End of training")
        self.wait(getattr(self.hub, "hub_wait_s", None))

    def _idle(self) -> bool:
        return self._waiting is None and self._busy is None

    def wait(self, timeout: float | None = None) -> bool:
        """Until nothing is queued or uploading, at most ``timeout`` seconds (None: no bound); a line when it
        has to wait and one when it gives up. True when everything queued was handled."""
        with self._cond:
            if self._idle():
                return self._report_failed()
            last = (self._waiting or (self._busy, ""))[0]
            bound = "" if timeout is None else f" (at most {timeout:g} s: --hub_wait_s)"
            self.say(f"waiting for the push of {last.name} to {self.hub.hub_model_id}{bound}", flush=True)
            done = self._cond.wait_for(self._idle, timeout=timeout)
        if not done:
            self.say(f"warning: the push of {last.name} did not finish in {timeout:g} s; training is done and "
                     f"{last} stays on disk (`yxanul push {last} --hub_model_id {self.hub.hub_model_id}` sends it)")
            return False
        return self._report_failed()

    def _report_failed(self) -> bool:
        if not self.failed:
            return True
        newest = self.failed[-1]
        self.say(f"warning: {newest} was not pushed; it stays on disk (`yxanul push {newest} --hub_model_id "
                 f"{self.hub.hub_model_id}` sends it)")
        return False

    def _push(self, ckpt: Path, message: str) -> None:
        try:
            staged = export(ckpt, self.staging / ckpt.name, overwrite=True, license=self.hub.hub_license,
                            repo_id=self.hub.hub_model_id)
        except Exception as e:  # noqa: BLE001 - an export problem must not stop training
            self.say(f"warning: push to the Hub: export of {ckpt} failed ({type(e).__name__}: {e}); not pushed")
            return
        with self._cond:
            superseded, self._waiting = self._waiting, (staged, f"{message}, step {_step(staged)}")
            self._cond.notify_all()  # wakes a backoff: the newer export goes first
            # decided under the lock the worker exits under: a worker that found nothing waiting and is still
            # alive (is_alive) would leave this export queued with no thread to upload it
            start, self._running = not self._running, True
        if superseded is not None and superseded[0] != staged:
            shutil.rmtree(superseded[0], ignore_errors=True)
        if start:
            self._thread = threading.Thread(target=self._worker, name="yxanul-hub-push", daemon=True)
            self._thread.start()

    def _worker(self) -> None:
        try:
            self._work()
        except BaseException:
            with self._cond:
                self._running = False  # the next push starts a worker again
            raise

    def _work(self) -> None:
        while True:
            with self._cond:
                if self._waiting is None:
                    self._running = False
                    return
                (staged, message), self._waiting = self._waiting, None
                self._busy = staged
            ok = self._upload(staged, message)
            with self._cond:
                self._busy = None
                if not ok:
                    self._keep_failed(staged)
                self._cond.notify_all()

    def _upload(self, staged: Path, message: str) -> bool:
        """Up to ``retries`` attempts; gives up early when a newer export is waiting (it supersedes this one)."""
        api = self.api or hub_push.default_api()
        for attempt in range(1, self.retries + 1):
            try:
                url = upload(api, staged, self.hub.hub_model_id, private=self.hub.hub_private,
                             revision=self.hub.hub_revision, commit_message=message)
            except Exception as e:  # noqa: BLE001 - network/Hub errors: warn once per outage, never crash training
                if not self._outage:
                    self._outage = True
                    self.say(f"warning: push to {self.hub.hub_model_id} failed (attempt {attempt}/{self.retries}): "
                             f"{type(e).__name__}: {first_line(e)}; training goes on, "
                             "retrying in the background (one more line when a push succeeds)")
                with self._cond:
                    if attempt == self.retries or self._cond.wait_for(lambda: self._waiting is not None,
                                                                      timeout=self.backoff_s * attempt):
                        return False
                continue
            self._pushed(staged, url, message)
            return True
        return False

    def _pushed(self, staged: Path, url: str, message: str) -> None:
        self.pushed.append(url)
        if self._outage:
            self._outage = False
            self.say(f"push to {self.hub.hub_model_id} works again")
        self.say(f"pushed {staged.name} to {self.hub.hub_model_id}: {message}")
        with self._cond:
            older, self.failed = self.failed, []
        for old in older:  # older staged folders that failed: superseded by this full upload
            if old != staged:
                shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(staged, ignore_errors=True)

    def _keep_failed(self, staged: Path) -> None:
        """Like checkpoints: the newest ``keep_last`` staged folders that failed stay (caller holds the lock)."""
        self.failed = [f for f in self.failed if f != staged] + [staged]
        for old in self.failed[:-self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        self.failed = self.failed[-self.keep_last:]

