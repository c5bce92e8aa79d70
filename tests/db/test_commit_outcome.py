"""A completion whose connection is lost during COMMIT (db/file_changes.py): the outcome is read back
by the lease's token, and the files follow what the database says."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from dataminer_dagster.db.engine import get_engine
from dataminer_dagster.db.file_changes import committing, file_changes
from dataminer_dagster.db.leases import LeaseStore
from tests.helpers.pipeline import work_items


class CutAfterCommit:
    """A TCP proxy in front of the server (its Unix socket, or its TCP address) that, once armed,
    passes a COMMIT on to the server and then cuts the client off before the answer: the client
    cannot tell whether it went through."""

    def __init__(self, database_url: str):
        url = make_url(database_url)
        if url.host:  # a server on TCP (CI's PostgreSQL 15)
            self._server_address = (socket.AF_INET, (url.host, url.port or 5432))
        else:  # the embedded server's socket directory
            self._server_address = (
                socket.AF_UNIX,
                f"{url.query['host']}/.s.PGSQL.{url.port or 5432}",
            )
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = url.set(host="127.0.0.1", port=self._listener.getsockname()[1], query={})
        self.armed = threading.Event()
        self.cut = threading.Event()
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
            cutting = threading.Event()  # this connection's COMMIT went through the proxy
            for args in ((client, server, True, cutting), (server, client, False, cutting)):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, to_server: bool, cutting) -> None:
        try:
            while data := source.recv(65536):
                if not to_server and cutting.is_set():
                    return  # the answer to the COMMIT: dropped
                if to_server and self.armed.is_set() and b"COMMIT\x00" in data:
                    self.armed.clear()
                    cutting.set()
                    self.cut.set()
                    target.sendall(data)
                    time.sleep(0.5)  # the server commits; its answer never reaches the client
                    return
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
    cut = CutAfterCommit(database_url)
    yield cut
    cut.close()


def test_a_completion_that_went_through_keeps_its_published_files(proxy, tmp_path):
    engine = get_engine(proxy.url.render_as_string(hide_password=False))
    store = LeaseStore(engine)
    store.enqueue("download", ["v0"])
    [lease] = store.claim_next("download", "run-1")
    final, staged = tmp_path / "out", tmp_path / ".staging-out"
    final.mkdir()
    (final / "old").write_text("the old output")
    staged.mkdir()
    (staged / "new").write_text("the new output")

    proxy.armed.set()
    with store.completing(lease) as conn:
        file_changes(conn).publish(staged, final)
    assert proxy.cut.is_set(), "the COMMIT's answer was cut off"
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


def test_file_changes_need_a_transaction_that_settles_them(engine, tmp_path: Path):
    with engine.begin() as conn, pytest.raises(RuntimeError, match="committing"):
        file_changes(conn)
