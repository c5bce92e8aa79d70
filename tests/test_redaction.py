"""Secrets in URLs (a password in the user info, a signed token in the query) stay out of every
message: logs, the Dagster event log, stored errors, `dataminer status`, `dataminer db url`."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from dataminer_dagster.acquisition.video_ids import video_id_for_url
from dataminer_dagster.assets.catalog.asset import video_catalog
from dataminer_dagster.assets.download.asset import downloads
from dataminer_dagster.cli import main
from dataminer_dagster.config import parse_project_config
from dataminer_dagster.core.redact import redact, redact_url
from dataminer_dagster.db.catalog import Catalog
from dataminer_dagster.db.leases import LeaseStore
from dataminer_dagster.partitions import projects_partitions, videos_partitions
from dataminer_dagster.paths import DataPaths
from dataminer_dagster.testing import instance_for_test
from tests.helpers.http_server import LocalHTTPServer
from tests.helpers.pipeline import materialize_partitions, resources, work_items

SECRETS = ("S3cretPW", "tok3nVALUE", "sig4ture")


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (
            "http://alice:S3cretPW@example.com/x.mp4?token=tok3nVALUE&sig=sig4ture#t=sig4ture",
            "http://alice:***@example.com/x.mp4?token=***&sig=***#***",
        ),
        ("https://example.com/x.mp4?tok3nVALUE", "https://example.com/x.mp4?***"),
        ("https://ghp_tok3nVALUE@example.com/x.mp4", "https://***@example.com/x.mp4"),
        ("https://youtu.be/dQw4w9WgXcQ", "https://youtu.be/dQw4w9WgXcQ"),
        ("postgresql://user:secret@host:5432/db", "postgresql://user:***@host:5432/db"),
        ("postgresql+psycopg://u:p%40ss@h/db", "postgresql+psycopg://u:***@h/db"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),
        ("postgresql:///db?host=/tmp/sock", "postgresql:///db?host=/tmp/sock"),
        (
            "postgresql://u@h/db?sslmode=require&password=secret",
            "postgresql://u@h/db?sslmode=require&password=***",
        ),
        (
            "postgresql+psycopg://postgres:@/dataminer?host=/tmp/d",
            "postgresql+psycopg://postgres:@/dataminer?host=/tmp/d",
        ),
    ],
)
def test_a_url_keeps_where_it_points_and_loses_its_secrets(url, redacted):
    assert redact_url(url) == redacted


def test_every_url_inside_a_text_is_redacted_and_the_rest_left_alone():
    text = (
        "ERROR: [generic] Unable to download webpage: HTTP Error 404: Not Found "
        "(caused by <HTTPError 404: 'http://alice:S3cretPW@127.0.0.1:8000/x.mp4?token=tok3nVALUE'>); "
        "video 'https://cdn.example/v.mp4?sig=sig4ture', retry in 30 s"
    )
    redacted = redact(text)
    assert not any(secret in redacted for secret in SECRETS)
    assert "HTTP Error 404: Not Found" in redacted and "retry in 30 s" in redacted
    assert "'http://alice:***@127.0.0.1:8000/x.mp4?token=***'>" in redacted
    assert "'https://cdn.example/v.mp4?sig=***'," in redacted
    assert redact("no url here: a:b@c") == "no url here: a:b@c"


def test_db_url_masks_a_password_given_as_a_query_parameter(dataminer_env, monkeypatch):
    monkeypatch.setenv(
        "DATAMINER_DATABASE_URL", "postgresql://miner@db.example/dm?password=hunter2"
    )
    result = CliRunner().invoke(main, ["db", "url"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert "db.example/dm?password=***" in result.output


@pytest.mark.slow
def test_a_failing_video_url_with_secrets_never_shows_them(
    tmp_path: Path, database_url, engine, dataminer_env, caplog, capfd
):
    root = tmp_path / "www"
    root.mkdir()
    with LocalHTTPServer(root) as server:
        server.respond("/missing.mp4", status=404)
        base = server.url("/missing.mp4")
        url = base.replace("http://", "http://alice:S3cretPW@") + "?token=tok3nVALUE&sig=sig4ture"
        config = parse_project_config(
            {
                "name": "p1",
                "inputs": {"urls": [url]},
                "download": {"allow_private_networks": True},  # served on 127.0.0.1
                "filter": {"positive_prompts": ["a thing"]},
            }
        )
        data_dir = dataminer_env / "data"
        catalog = Catalog(engine, LeaseStore(engine), DataPaths(data_dir))
        catalog.projects.register(config)
        video = video_id_for_url(url)
        caplog.set_level(logging.DEBUG)
        with instance_for_test() as instance:
            res = resources(database_url, data_dir)
            materialize_partitions(
                [video_catalog],
                ["p1"],
                instance=instance,
                resources=res,
                partitions=projects_partitions,
            )
            materialize_partitions(
                [downloads],
                [video],
                instance=instance,
                resources=res,
                partitions=videos_partitions,
                raise_on_error=False,
            )
            events = [
                dg.serialize_value(record)
                for run in instance.get_runs()
                for record in instance.all_logs(run.run_id)
            ]
        assert any("404" in e for e in events), "the failure itself is reported"
        last_error = work_items(engine, "download")[video].last_error
        assert "404" in last_error and "127.0.0.1" in last_error
        status = CliRunner().invoke(main, ["status", "p1", "--json"], catch_exceptions=False)
        assert status.exit_code == 0, status.output
        assert "404" in status.output

    captured = capfd.readouterr()
    places = {
        "log records": "\n".join(r.getMessage() for r in caplog.records),
        "stdout/stderr": captured.out + captured.err,
        "Dagster event log": "\n".join(events),
        "work_items.last_error": last_error,
        "dataminer status --json": json.dumps(json.loads(status.output)),
    }
    leaks = {
        place: secret for place, text in places.items() for secret in SECRETS if secret in text
    }
    assert leaks == {}
