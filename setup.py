from setuptools import find_packages, setup

setup(
    name="realrl",
    version="0.1.0",
    description="Dataflow-graph, distributed RLHF (SFT, reward modeling, DPO, PPO, GRPO) over packed batches",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["realrl", "realrl.*"]),
    package_data={"realrl": ["**/*.json", "**/*.txt", "**/*.c"]},
    install_requires=[
        # torch: install the build for your machine first (README); any >= 2.4 works.
        "torch>=2.4",
        "transformers>=4.45",
        "ray>=2.59",  # token authentication on by default for the local clusters it starts
        "pyzmq>=25",
        "omegaconf>=2.3,<2.5",  # structured configs (hydra's config library)
        "hydra-core>=1.3.2,<1.4",  # the command line: compose API, override grammar, sweeps
        "peft>=0.13",  # LoRA adapters (<role>.lora.*)
        "safetensors>=0.4",
        "tokenizers>=0.19",
        "numpy>=1.24",
        "networkx>=3.0",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        "datasets>=2.18",
        "tensorboard>=2.14",
        "aiohttp>=3.9",  # the agents' OpenAI-compatible chat endpoint (realrl.impl.agents)
    ],
    extras_require={
        "gpu": ["flash-attn>=2.5"],
        "test": [
            "pytest>=7.4",
            "pytest-timeout>=2.2",
            "pytest-xdist>=3.5",  # the suite runs in two processes: its tests mostly wait on start-ups
            "hypothesis>=6.90",
            "ruff>=0.5",
            "trl>=1.16",
            "psutil>=5.9",
            "openai>=1.40",  # the client the agents of tests/agents talk through
        ],
        "bench": ["trl>=0.12", "psutil>=5.9"],
    },
)
