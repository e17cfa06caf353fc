import os

from setuptools import find_packages, setup

with open(os.path.join("sb3_ppg", "version.txt")) as file_handler:
    __version__ = file_handler.read().strip()

with open("README.md", encoding="utf-8") as file_handler:
    long_description = file_handler.read()

# The Procgen games (the procgen extra, included in zoo and tests): OpenAI's procgen (Python 3.10) and its mirror (3.11,
# 3.12) are built against numpy 1.x and bring gym3 and gym 0.26; procgen-gym (3.13) is a Gymnasium port built against
# numpy 2, without gym or gym3. sb3_ppg.procgen gives the same envs (same levels, dynamics and seeding) on either.
PROCGEN_REQUIRES = [
    "procgen==0.10.7; python_version<'3.11'",
    "procgen-mirror==0.10.7; python_version>='3.11' and python_version<'3.13'",
    "procgen-gym>=0.1.1,<0.2; python_version>='3.13'",
    # gym 0.26 (procgen's gym3 env only: sb3_ppg uses Gymnasium) prints a maintenance notice on import, which
    # gym-notices 0.1 added; SB3 imports gym whenever it is installed, so without this pin `import stable_baselines3`
    # and every example would print it
    "gym-notices<0.1; python_version<'3.13'",
    "numpy>=1.20,<2.0; python_version<'3.13'",
    # pandas 3 needs numpy 2: without this pin pip backtracks into failing source builds where numpy<2
    "pandas<3; python_version<'3.13'",
]

setup(
    name="sb3-ppg",
    packages=[package for package in find_packages() if package.startswith("sb3_ppg")],
    package_data={
        "sb3_ppg": [
            "py.typed",
            "version.txt",
            "cli/hyperparams/*.yml",
            "cli/data/*.csv",
            "cli/data/*/*.csv",
            "cli/data/*/LICENSE",
            "cli/data/*/README.md",
        ]
    },
    install_requires=[
        "stable-baselines3>=2.7.1,<3.0",
        # MaskablePPG (sb3_ppg.ppg_mask): sb3-contrib's maskable distributions, buffers and tools
        "sb3-contrib>=2.7.1,<3.0",
        "torch>=2.3",
        "gymnasium>=0.29.1,<1.5",
        # numpy 2 wherever nothing else holds it back (the procgen extra pins numpy 1 below Python 3.13)
        "numpy>=1.20",
        "shimmy>=1.3",
    ],
    extras_require={
        "procgen": PROCGEN_REQUIRES,
        "zoo": [
            *PROCGEN_REQUIRES,
            "rl_zoo3>=2.7.0,<3.0",
            # rl_zoo3's enjoy imports requests without declaring it
            "requests",
            "optuna>=3.0",
            "matplotlib",
            "tqdm",
            "rich",
            "tensorboard",
            # Videos (SB3's VecVideoRecorder, gymnasium's RecordVideo) write with moviepy, which imports imageio-ffmpeg;
            # the imageio-ffmpeg 0.3 that gym3 pins (Python < 3.13) imports pkg_resources, which setuptools 81 removed
            # (installing torch brings a newer setuptools). procgen-gym (3.13) brings no gym3: any imageio-ffmpeg works.
            "moviepy>=1.0.0",
            "setuptools<81; python_version<'3.13'",
        ],
        "tests": [
            *PROCGEN_REQUIRES,
            "pytest",
            "pytest-xdist",
            "ruff",
            "tqdm",
            "rich",
            "tensorboard",
            "rl_zoo3>=2.7.0,<3.0",
            "requests",
            "optuna>=3.0",
            "matplotlib",
            "moviepy>=1.0.0",
            # imageio-ffmpeg 0.3 (pinned by gym3) imports pkg_resources, which setuptools 81 removed
            "setuptools<81; python_version<'3.13'",
            # tests/test_docs.py builds the documentation
            "sphinx>=7",
            "myst-parser",
            "sphinx-rtd-theme",
        ],
        "docs": ["sphinx>=7", "myst-parser", "sphinx-rtd-theme"],
    },
    entry_points={
        "console_scripts": [
            "sb3_ppg_train=sb3_ppg.cli.train:main",
            "sb3_ppg_enjoy=sb3_ppg.cli.enjoy:main",
            "sb3_ppg_plot=sb3_ppg.cli.plot:main",
        ]
    },
    description="Phasic Policy Gradient (PPG) for Stable-Baselines3",
    author="sb3-ppg developers",
    license="MIT",
    long_description=long_description,
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.14",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ],
    version=__version__,
)
