"""A completion whose connection is lost, or whose run is terminated, during COMMIT
(db/file_changes.py): the outcome is read back by the lease's token, and the files follow what the
database says."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._utils.interrupts import raise_interrupts_as
from sqlalchemy.engine import make_url

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.file_changes import committing, file_changes
from dataminer_dagster.db.leases import LeaseStore
from tests.helpers.pipeline import work_items


class CommitProxy:
    """A TCP proxy in front of the server (its Unix socket, or its TCP address) that, once armed,
    passes a COMMIT on to the server and holds its answer back. Then it either cuts the client off
    (the client cannot tell whether the COMMIT went through) or, with `interrupt`, sends SIGINT to
    this process and passes the answer on: a run's Terminate that lands while its COMMIT waits."""

    def __init__(self, database_url: str, interrupt: bool = False):
        url = make_url(database_url)
        if url.host:  # a server on TCP (CI's PostgreSQL 15)
            self._server_address = (socket.AF_INET, (url.host, url.port or 5432))
        else:  # the embedded server's socket directory
            self._server_address = (
                socket.AF_UNIX,
                f"{url.query['host']}/.s.PGSQL.{url.port or 5432}",
            )
        self._interrupt = interrupt
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = url.set(host="127.0.0.1", port=self._listener.getsockname()[1], query={})
        self.armed = threading.Event()
        self.caught = threading.Event()  # a COMMIT went through the armed proxy
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            family, address = self._server_address
            server = socket.socket(family)
            server.connect(address)
            held = threading.Event()  # this connection's COMMIT went through the proxy
            released = threading.Event()  # its answer may pass
            for args in (
                (client, server, True, held, released),
                (server, client, False, held, released),
            ):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(
        self,
        source: socket.socket,
        target: socket.socket,
        to_server: bool,
        held: threading.Event,
        released: threading.Event,
    ) -> None:
        try:
            while data := source.recv(65536):
                if not to_server and held.is_set():
                    released.wait()
                    if not self._interrupt:
                        return  # the answer to the COMMIT: dropped
                if to_server and self.armed.is_set() and b"COMMIT\x00" in data:
                    self.armed.clear()
                    held.set()
                    self.caught.set()
                    target.sendall(data)
                    time.sleep(0.5)  # the server commits; its answer waits here
                    if not self._interrupt:
                        released.set()
                        return
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)  # the client's wait is interrupted first
                    released.set()
                    continue
                target.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, target):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def proxy(database_url):
    cut = CommitProxy(database_url)
    yield cut
    cut.close()


def a_completion_to_publish(proxy: CommitProxy, tmp_path: Path):
    """(engine, store, lease, final, staged): an item claimed through `proxy`, its final output
    holding an old file and its staging a new one."""
    engine = get_engine(proxy.url.render_as_string(hide_password=False))
    store = LeaseStore(engine)
    store.enqueue("download", ["v0"])
    [lease] = store.claim_next("download", "run-1")
    final, staged = tmp_path / "out", tmp_path / ".staging-out"
    final.mkdir()
    (final / "old").write_text("the old output")
    staged.mkdir()
    (staged / "new").write_text("the new output")
    return engine, store, lease, final, staged


def test_a_completion_that_went_through_keeps_its_published_files(proxy, tmp_path):
    engine, store, lease, final, staged = a_completion_to_publish(proxy, tmp_path)

    proxy.armed.set()
    with store.completing(lease) as conn:
        file_changes(conn).publish(staged, final)
    assert proxy.caught.is_set(), "the COMMIT's answer was cut off"
    assert (final / "new").read_text() == "the new output", "committed: the new output stays"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the old one deleted"
    assert work_items(engine, "download")["v0"].status == "done"


def test_without_a_way_to_read_it_back_a_lost_commit_deletes_nothing(proxy, tmp_path):
    engine = get_engine(proxy.url.render_as_string(hide_password=False))
    released = tmp_path / "frames"
    released.mkdir()
    proxy.armed.set()
    with pytest.raises(Exception, match="no file was deleted"), committing(engine) as conn:
        conn.execute(sa.text("SELECT 1"))
        file_changes(conn).set_aside(released)
    assert released.is_dir(), "put back: whether it committed is not known"
    assert [p.name for p in tmp_path.iterdir()] == ["frames"]


@pytest.fixture
def interrupting_proxy(database_url):
    assert threading.current_thread() is threading.main_thread(), "a signal's handler runs there"
    proxy = CommitProxy(database_url, interrupt=True)
    yield proxy
    proxy.close()


def test_a_terminate_during_a_commit_that_went_through_keeps_its_files_and_stops_the_run(
    interrupting_proxy, tmp_path
):
    """Dagster terminates a run with one SIGINT, raised in its step as
    DagsterExecutionInterruptedError: the completion's files follow the COMMIT read back, and the
    interrupt goes on (swallowed, the run would go on to its end)."""
    engine, store, lease, final, staged = a_completion_to_publish(interrupting_proxy, tmp_path)

    interrupting_proxy.armed.set()
    with (
        raise_interrupts_as(DagsterExecutionInterruptedError),
        pytest.raises(DagsterExecutionInterruptedError),
        store.completing(lease) as conn,
    ):
        file_changes(conn).publish(staged, final)
    assert interrupting_proxy.caught.is_set(), "the interrupt came while the COMMIT waited"
    assert (final / "new").read_text() == "the new output", "committed: the new output stays"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "the old one deleted"
    assert work_items(engine, "download")["v0"].status == "done"


def test_a_terminate_during_a_commit_that_cannot_be_read_back_deletes_nothing_and_goes_on(
    interrupting_proxy, tmp_path
):
    engine = get_engine(interrupting_proxy.url.render_as_string(hide_password=False))
    released = tmp_path / "frames"
    released.mkdir()
    interrupting_proxy.armed.set()
    with (
        raise_interrupts_as(DagsterExecutionInterruptedError),
        pytest.raises(DagsterExecutionInterruptedError),
        committing(engine) as conn,
    ):
        conn.execute(sa.text("SELECT 1"))
        file_changes(conn).set_aside(released)
    assert released.is_dir(), "put back: whether it committed is not known"
    assert [p.name for p in tmp_path.iterdir()] == ["frames"]


def test_file_changes_need_a_transaction_that_settles_them(engine, tmp_path: Path):
    with engine.begin() as conn, pytest.raises(RuntimeError, match="committing"):
        file_changes(conn)
