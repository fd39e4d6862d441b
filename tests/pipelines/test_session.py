"""Where the tasks run: in ``cluster`` mode, separate executor processes that import delayapp
from the shipped zip; and the pieces a job needs to ship it (``package-zip``, ``--py-files``)."""

from __future__ import annotations

import os
import zipfile

import pytest

from delayapp.pipelines import __main__ as pipelines_cli
from delayapp.pipelines import common, optimizer
from delayapp.pipelines.session import PACKAGE_ZIP

pytestmark = pytest.mark.integration


def test_tasks_run_where_the_mode_says(spark, spark_mode, spark_home):
    def where(_: object) -> list[tuple[str, int, str, str]]:
        """Inside a task: its working directory, its process, and where delayapp and the data source
        came from. Nested, so it is pickled by value: executors cannot import this test module."""
        import delayapp
        import delayapp.pipelines.kafka_source as source

        return [(os.getcwd(), os.getpid(), delayapp.__file__, source.__file__)]

    seen = spark.sparkContext.parallelize(range(8), 8).mapPartitions(where).collect()
    workdirs = {cwd for cwd, *_ in seen}
    if spark_mode == "local":
        assert workdirs == {os.getcwd()}  # Python workers forked by the one JVM
        return
    # A standalone worker starts each executor JVM in its own directory, work/<app>/<executor id>.
    assert len(workdirs) == 2 and all(
        os.path.dirname(os.path.dirname(w)) == str(spark_home / "work") for w in workdirs
    ), workdirs
    assert os.getpid() not in {pid for _, pid, *_ in seen}
    # delayapp came from the zip shipped with the job, not from this checkout or site-packages.
    inside = f"{PACKAGE_ZIP}{os.sep}delayapp{os.sep}"
    assert all(inside in package and inside in source for _, _, package, source in seen), seen[0]


def test_package_zip_command_writes_the_sources(tmp_path, capsys):
    assert pipelines_cli.main(["package-zip", "--out", str(tmp_path)]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(tmp_path / PACKAGE_ZIP)
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    assert {"delayapp/__init__.py", "delayapp/pipelines/kafka_source.py", "delayapp/core/headers.py"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)


def test_py_files_option_reaches_the_session(monkeypatch):
    built = {}

    def fake_session(app_name, master, conf, py_files=()):
        built.update(master=master, conf=conf, py_files=py_files)
        raise common.PipelineError("stop here")  # the session is all this test is about

    monkeypatch.setattr(common, "build_session", fake_session)
    args = [
        "--master",
        "spark://m:7077",
        "--py-files",
        "a.zip,b.py",
        "--py-files",
        "c.zip",
        "--conf",
        "spark.executor.cores=2",
        "--quiet",
    ]
    assert optimizer.main(args) == 2
    assert built == {
        "master": "spark://m:7077",
        "conf": {"spark.executor.cores": "2"},
        "py_files": ["a.zip", "b.py", "c.zip"],
    }
