import json
import subprocess
import sys

import pytest

from collage_ml.cli import main


def test_inspect_json(capsys):
    assert main(["inspect", "resnet50-tiny", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] > 10 and info["flops"] > 0
    assert info["op_histogram"]["Conv"] >= 5


@pytest.mark.slow
def test_inspect_resnet50_json(capsys):
    assert main(["inspect", "resnet50", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] == 122
    assert 8.0e9 < info["flops"] < 8.4e9  # 4.1 GMACs
    assert info["op_histogram"]["Conv"] == 53


def test_zoo_list_json(capsys):
    assert main(["zoo", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows}
    assert {"bert", "bert-tiny", "resnet50", "nasrnn-tiny"} <= names


def test_zoo_export(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main(["zoo", "export", "dcgan-tiny", "-o", str(out), "--batch", "2"]) == 0
    import onnx

    m = onnx.load(str(out))
    onnx.checker.check_model(m)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_model_errors_exit_1_with_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx at all")
    assert main(["inspect", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("collage-ml: error:") and "bad.onnx" in err and "\n" not in err


def test_unknown_zoo_name_suggests(capsys):
    assert main(["inspect", "resnet5"]) == 1
    assert "resnet50" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["inspect"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["zoo", "export", "bert-tiny", "-o", "x.onnx", "--batch", "0"])
    assert e.value.code == 2


def test_console_script_no_traceback(tmp_path):
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(b"\x08\x07")
    r = subprocess.run([sys.executable, "-m", "collage_ml.cli", "inspect", str(bad)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "trunc.onnx" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "collage_ml.cli", "--debug", "inspect", str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_backends_lists_configuration_grids(capsys):
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime[opt=all|extended|basic|none, pool=own|shared, skipln=on|off, spin=off|on]" in out
    assert "openvino[" in out and "streams=" in out
