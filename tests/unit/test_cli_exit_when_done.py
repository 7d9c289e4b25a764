"""``main()`` ends a finished ``millstream run --available-now`` with ``os._exit``
(:func:`millstream.cli.app.exit_when_done`) only when nothing is left that the interpreter's
exit would wait for: a thread still at work (not a daemon, not an idle read pool's worker)
keeps the normal exit, which waits for it; so does a command that failed. The process's end
itself is replaced here by a recorder."""

from __future__ import annotations

import threading

import pytest

import millstream.cli.app as app_module


def test_a_finished_run_ends_at_once_only_when_no_thread_is_still_at_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[str] = []
    ended: list[int] = []
    monkeypatch.setattr(app_module, "_WHEN_DONE", [lambda: closed.append("store")])
    monkeypatch.setattr(app_module, "_exit_now", ended.append)
    main = threading.main_thread()
    release = threading.Event()
    upload = threading.Thread(target=release.wait, name="upload")  # not a daemon: at work
    pool = threading.Thread(target=release.wait, name="millstream-read-files_0", daemon=False)
    upload.start()
    pool.start()
    try:
        monkeypatch.setattr(threading, "enumerate", lambda: [main, upload, pool])
        app_module._end_when_done(0)
        assert (closed, ended) == ([], []), "ended the process under a thread at work"

        app_module._end_when_done(2)  # a failed command exits as usual
        assert (closed, ended) == ([], [])

        # Only the main thread and an idle read pool's worker: closed, then ended.
        monkeypatch.setattr(threading, "enumerate", lambda: [main, pool])
        app_module._end_when_done(0)
        assert (closed, ended) == (["store"], [0])
    finally:
        release.set()
        upload.join()
        pool.join()
