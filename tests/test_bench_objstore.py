"""``ckptsim bench --dir s3://...`` against a real S3-compatible server (moto on 127.0.0.1)."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main

pytest_plugins = ("_s3server",)
pytest.importorskip("s3fs")


def test_a_tiny_bench_measures_raw_torch_safetensors_and_ckptsim_on_s3(s3_url, capsys):
    import s3fs

    argv = ["bench", "--sizes", "300K", "--repeats", "2", "--dir", s3_url, "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {r["format"]: r for r in data["results"]}
    assert set(rows) == {"raw", "torch", "safetensors", "ckptsim"}
    for fmt, r in rows.items():
        assert r["repeats"] == 2 and r["save_s_median"] > 0 and r["load_s_median"] > 0
        assert r["bytes"] >= rows["raw"]["bytes"] > 0, fmt  # every tensor byte went up
    assert data["machine"]["directory"] == s3_url
    assert any("object storage" in n for n in data["notes"])
    bucket = s3_url[len("s3://") :].split("/")[0]
    assert s3fs.S3FileSystem(skip_instance_cache=True).find(bucket) == []  # all cleaned up


def test_the_human_table_names_the_object_store(s3_url, capsys):
    assert main(["bench", "--sizes", "300K", "--repeats", "1", "--dir", s3_url]) == 0
    out = capsys.readouterr().out
    assert "ckptsim" in out and f"note: object storage at {s3_url}" in out
    assert out.startswith("raw object store: put ") and "posix_fadvise" not in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--formats", "dcp"], "--formats dcp cannot be measured at s3://"),
        (["--formats", "ckptsim", "--writers", "1,2"], "--writers measures parallel writers"),
    ],
)
def test_what_an_object_store_does_not_measure_is_refused_in_one_line(
    s3_url, capsys, extra, message
):
    assert main(["bench", "--sizes", "300K", "--repeats", "1", "--dir", s3_url, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_missing_bucket_is_one_line(s3_server, capsys):
    argv = ["bench", "--sizes", "300K", "--repeats", "1", "--dir", "s3://no-such-bucket-x/b"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach s3://no-such-bucket-x/b" in err and "\n" not in err
