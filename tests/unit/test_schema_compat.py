import json
import shutil

import pytest

from cronwheel.core.avro import SCHEMA_DIR
from cronwheel.core.schema_compat import check, main


@pytest.fixture
def schema_dir(tmp_path):
    shutil.copy(SCHEMA_DIR / "RunCompleted.v1.avsc", tmp_path)
    return tmp_path


def write_v2(directory, change):
    schema = json.loads((directory / "RunCompleted.v1.avsc").read_text())
    change(schema["fields"])
    (directory / "RunCompleted.v2.avsc").write_text(json.dumps(schema))


def problems(directory):
    return [str(f) for f in check(directory) if not f.ok]


def test_real_schemas__pass(capsys):
    assert problems(SCHEMA_DIR) == []
    assert main([str(SCHEMA_DIR)]) == 0
    assert "RunReady v1: ok" in capsys.readouterr().out


def test_v2_removes_field_without_default__fails_forward(schema_dir, capsys):
    write_v2(
        schema_dir, lambda fields: fields.remove(next(f for f in fields if f["name"] == "state"))
    )

    [problem] = problems(schema_dir)

    assert problem.startswith("RunCompleted v1 -> v2: not forward compatible")
    assert "state" in problem
    assert main([str(schema_dir)]) == 1
    captured = capsys.readouterr()
    assert "not forward compatible" in captured.out and "FAILED" in captured.err


def test_v2_adds_field_with_default__passes(schema_dir, capsys):
    write_v2(
        schema_dir,
        lambda fields: fields.append(
            {"name": "exit_code", "type": ["null", "int"], "default": None}
        ),
    )

    assert problems(schema_dir) == []
    assert main([str(schema_dir)]) == 0
    assert "RunCompleted v1 -> v2: ok" in capsys.readouterr().out


def test_v2_adds_field_without_default__fails_backward(schema_dir):
    write_v2(schema_dir, lambda fields: fields.append({"name": "exit_code", "type": "int"}))

    [problem] = problems(schema_dir)

    assert problem.startswith("RunCompleted v1 -> v2: not backward compatible")
    assert "exit_code" in problem


def test_version_gap__fails(schema_dir):
    shutil.copy(schema_dir / "RunCompleted.v1.avsc", schema_dir / "RunCompleted.v3.avsc")

    assert problems(schema_dir) == [
        "RunCompleted: versions must run 1..N without gaps, found [1, 3]"
    ]


@pytest.mark.parametrize(
    "filename", ["RunCompleted.avsc", "RunCompleted.v0.avsc", "run-completed.v2.avsc"]
)
def test_badly_named_file__fails(schema_dir, filename):
    shutil.copy(schema_dir / "RunCompleted.v1.avsc", schema_dir / filename)

    assert problems(schema_dir) == [f"{filename}: name must be <Record>.v<N>.avsc, N from 1"]


def test_record_name_not_matching_file__fails(schema_dir):
    shutil.copy(schema_dir / "RunCompleted.v1.avsc", schema_dir / "RunDone.v1.avsc")

    [problem] = problems(schema_dir)

    assert problem.startswith("RunDone.v1.avsc: defines record dev.cronwheel.RunCompleted")
