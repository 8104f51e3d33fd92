"""The kernels are installed as `flowcore.kernels`, never as a top-level `kernels` module (that name
belongs to Hugging Face's `kernels` library, which transformers probes for)."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_LEVEL_KERNELS = (
    "import importlib.util, os, flowcore.kernels as k, transformers.models.bert.modeling_bert;"
    "spec = importlib.util.find_spec('kernels');"
    "print(spec is None or not os.path.abspath(spec.origin).startswith(os.path.join({repo!r}, 'kernels')),"
    " callable(k.plan), k.__name__)"
)


def test_kernels_live_under_flowcore_only(tmp_path):
    result = subprocess.run([sys.executable, "-c", TOP_LEVEL_KERNELS.format(repo=REPO)], capture_output=True,
                            text=True, cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "flowcore.kernels"]


def test_python_started_in_the_checkout_does_not_mistake_its_folder_for_hugging_faces_kernels():
    """`python -c`/`python -m` put the working folder on sys.path; from the checkout's root its
    `kernels/` would shadow the `kernels` package that transformers imports."""
    result = subprocess.run([sys.executable, "-c", TOP_LEVEL_KERNELS.format(repo=REPO)], capture_output=True,
                            text=True, cwd=REPO, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["True", "True", "flowcore.kernels"]


def test_console_script_lists_every_subcommand():
    result = subprocess.run([sys.executable, "-m", "flowcore", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("fit", "encode", "calibrate", "sts", "export"):
        assert f"    {command}" in result.stdout


def test_version_and_package_metadata():
    import importlib.metadata

    import flowcore

    script = os.path.join(os.path.dirname(sys.executable), "flowcore")  # the console script beside python
    for command in ([sys.executable, "-m", "flowcore", "--version"], [script, "--version"]):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout.strip() == f"flowcore {flowcore.__version__}", result
    metadata = importlib.metadata.metadata("flowcore")
    assert metadata["Version"] == flowcore.__version__
    assert metadata["License"] == "Apache-2.0" or "Apache-2.0" in (metadata.get("License-Expression") or "")
    assert any("Apache Software License" in line for line in metadata.get_all("Classifier"))
    requires = importlib.metadata.requires("flowcore")
    assert any(line.startswith("triton") and 'platform_system == "Linux"' in line for line in requires), requires
