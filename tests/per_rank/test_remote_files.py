"""Per-rank files on fsspec URLs: ``memory://`` and an in-process S3 server (parts merged on close), ``file://``.

On a filesystem without append or rename each flush is one new part object and ``close()`` merges them; whatever the
storage, the finished file has the bytes a local writer writes, and the reader returns the same table before and
after the merge.
"""

import os
import re
import uuid
from pathlib import Path

import fsspec
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightning_ext import read_rank_metrics
from lightning_ext.cli import main
from lightning_ext.rank_metrics import RankMetricsWriter, rank_metrics_path
from tests.helpers.s3 import BUCKET, s3_storage, use_s3
from tests.helpers.writer_calls import call_sequences

MEMORY = fsspec.filesystem("memory")
PART = re.compile(r"metrics\.csv\.part-[0-9a-f]{16}-[0-9]{8}$")


@pytest.fixture
def memory_dir():
    name = f"/lightning-ext-{uuid.uuid4().hex}"
    yield f"memory://{name}"
    if MEMORY.exists(name):
        MEMORY.rm(name, recursive=True)


def objects(url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(url)
    return sorted(name[len(path) + 1 :] for name in fs.find(path))


def log_all(writer: RankMetricsWriter, calls) -> RankMetricsWriter:
    for metrics, step in calls:
        writer.log_metrics(metrics, step=step)
    return writer


@given(calls=call_sequences(), flush_every=st.integers(1, 4))
def test_property_parts_read_and_merge_to_the_local_bytes(tmp_path_factory, calls, flush_every):
    local_dir = tmp_path_factory.mktemp("local")
    url = f"memory:///lightning-ext-{uuid.uuid4().hex}"
    try:
        with RankMetricsWriter.for_rank(local_dir, 0, flush_every_n_rows=flush_every) as local:
            log_all(local, calls)
        remote = log_all(RankMetricsWriter.for_rank(url, 0, flush_every_n_rows=flush_every), calls)
        remote.flush()
        parts = [name for name in objects(url) if PART.search(name)]
        assert len(parts) == -(-len(calls) // flush_every)  # one object per flush, nothing else yet
        expected = read_rank_metrics(local_dir)
        pd.testing.assert_frame_equal(read_rank_metrics(url), expected)  # the parts, read before any merge
        remote.close()
        assert objects(url) == ["rank_0/metrics.csv"]
        assert MEMORY.cat_file(url[len("memory://") :] + "/rank_0/metrics.csv") == Path(local.path).read_bytes()
        pd.testing.assert_frame_equal(read_rank_metrics(url), expected)
    finally:
        MEMORY.rm(url[len("memory://") :], recursive=True)


def test_each_flush_is_one_object_with_its_own_header(memory_dir):
    writer = RankMetricsWriter.for_rank(memory_dir, 0, flush_every_n_rows=2)
    log_all(writer, [({"loss": 1.0}, 0), ({"loss": 2.0}, 1), ({"loss": 3.0, "acc": 0.5}, 2)])
    (part,) = objects(memory_dir)
    assert PART.search(part) and part.endswith("-00000001")
    assert MEMORY.cat_file(f"{memory_dir[9:]}/{part}") == b"loss,step\r\n1.0,0\r\n2.0,1\r\n"
    writer.flush()
    second = objects(memory_dir)[1]
    assert second.endswith("-00000002")
    assert MEMORY.cat_file(f"{memory_dir[9:]}/{second}") == b"acc,loss,step\r\n0.5,3.0,2\r\n"
    writer.close()
    assert (
        MEMORY.cat_file(f"{memory_dir[9:]}/rank_0/metrics.csv") == b"acc,loss,step\r\n,1.0,0\r\n,2.0,1\r\n0.5,3.0,2\r\n"
    )


def test_a_merge_cut_short_after_its_write_counts_no_row_twice(memory_dir, monkeypatch):
    writer = RankMetricsWriter.for_rank(memory_dir, 0, flush_every_n_rows=1)
    log_all(writer, [({"loss": 1.0}, 0), ({"loss": 2.0}, 1)])
    with monkeypatch.context() as patch:  # the merged file is written, then the process "dies" before the deletes

        def die(*args: object) -> None:
            raise KeyboardInterrupt

        patch.setattr(type(MEMORY), "rm_file", die)
        with pytest.raises(KeyboardInterrupt):
            writer.close()
    assert len(objects(memory_dir)) == 3  # the merged file and both (now stale) parts
    assert read_rank_metrics(memory_dir)["loss"].tolist() == [1.0, 2.0]
    with RankMetricsWriter.for_rank(memory_dir, 0, resume_from_step=10) as resumed:  # the next run tidies up
        resumed.log_metrics({"loss": 3.0}, step=2)
    assert objects(memory_dir) == ["rank_0/metrics.csv"]
    assert read_rank_metrics(memory_dir)["loss"].tolist() == [1.0, 2.0, 3.0]


def test_resume_and_a_new_run_on_an_object_store(memory_dir):
    writer = RankMetricsWriter.for_rank(memory_dir, 0, flush_every_n_rows=2)
    log_all(writer, [({"loss": float(step)}, step) for step in range(5)])  # 2 parts written, 1 row lost ("crash")
    with RankMetricsWriter.for_rank(memory_dir, 0, resume_from_step=2) as resumed:
        assert resumed.rows_written == 3
        resumed.log_metrics({"loss": 30.0}, step=3)
    assert read_rank_metrics(memory_dir)["loss"].tolist() == [0.0, 1.0, 2.0, 30.0]
    before = MEMORY.cat_file(f"{memory_dir[9:]}/rank_0/metrics.csv")
    with RankMetricsWriter.for_rank(memory_dir, 0) as fresh:
        fresh.log_metrics({"loss": 7.0}, step=0)
    assert fresh.rotated_to == f"{memory_dir}/rank_0/metrics.csv.1"
    assert MEMORY.cat_file(f"{memory_dir[9:]}/rank_0/metrics.csv.1") == before
    assert read_rank_metrics(memory_dir)["loss"].tolist() == [7.0]


def test_a_torn_part_is_skipped_with_a_warning(memory_dir):
    writer = RankMetricsWriter.for_rank(memory_dir, 0, flush_every_n_rows=2)
    log_all(writer, [({"loss": 1.0}, 0), ({"loss": 2.0}, 1)])
    (part,) = objects(memory_dir)
    path = f"{memory_dir[9:]}/{part}"
    MEMORY.pipe_file(path, MEMORY.cat_file(path) + b"3.")  # a store without atomic writes, cut mid-row
    with pytest.warns(RuntimeWarning, match=re.escape(f"{part}, line 4: ignored an incomplete last line")):
        assert read_rank_metrics(memory_dir)["loss"].tolist() == [1.0, 2.0]


def test_file_urls_write_locally_with_one_append_per_flush(tmp_path, monkeypatch):
    url = "file://" + str(tmp_path)
    writer = RankMetricsWriter.for_rank(url, 0, flush_every_n_rows=2)
    assert writer.path == f"{url}/rank_0/metrics.csv"
    log_all(writer, [({"loss": 1.0}, 0), ({"loss": 2.0}, 1)])
    local = Path(rank_metrics_path(tmp_path, 0))
    inode = local.stat().st_ino
    writes = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real_write(fd, data))
    log_all(writer, [({"loss": 3.0}, 2), ({"loss": 4.0}, 3)])
    monkeypatch.undo()
    writer.close()
    assert writes == [b"3.0,2\r\n4.0,3\r\n"] and local.stat().st_ino == inode
    assert [name for name in os.listdir(local.parent)] == ["metrics.csv"]
    pd.testing.assert_frame_equal(read_rank_metrics(url), read_rank_metrics(tmp_path))


@pytest.mark.timeout(120)
def test_s3_files_merged_or_in_parts_are_read_by_the_reader_and_the_cli(capsys):
    with s3_storage() as options, use_s3(options) as fs:
        url = f"s3://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
        with RankMetricsWriter.for_rank(url, 0, flush_every_n_rows=2) as finished:
            log_all(finished, [({"loss": 2.0}, 0), ({"loss": 1.0, "acc": 0.5}, 1), ({"loss": 0.5}, 2)])
        running = RankMetricsWriter.for_rank(url, 1, flush_every_n_rows=1)
        log_all(running, [({"loss": 3.0}, 0), ({"loss": 4.0}, 1)])  # not closed: two part objects
        prefix = url[len("s3://") :]
        names = [name[len(prefix) + 1 :] for name in fs.find(prefix)]
        assert names[0] == "rank_0/metrics.csv" and len(names) == 3
        assert all(name.startswith("rank_1/") and PART.search(name) for name in names[1:])
        assert fs.cat_file(f"{prefix}/rank_0/metrics.csv") == b"acc,loss,step\r\n,2.0,0\r\n0.5,1.0,1\r\n,0.5,2\r\n"
        table = read_rank_metrics(url)
        assert table["rank"].tolist() == [0, 0, 0, 1, 1] and table["loss"].tolist() == [2.0, 1.0, 0.5, 3.0, 4.0]
        assert main(["ranks", url]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"{url}: 2 rank(s), 5 row(s), 2 metric(s)"
        assert out[3].split() == ["loss", "0.5", "4", "0.5", "4", "2.47487", "0"]  # a tie: the lower rank
        running.close()
        assert [name.rsplit("/", 1)[-1] for name in fs.find(f"{prefix}/rank_1")] == ["metrics.csv"]
