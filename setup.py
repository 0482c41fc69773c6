"""Packaging for stealth-eval: metadata and requirements come from `settings.ini` (nbdev 2.x layout)."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]

requirements = cfg.get("requirements", "").split()
dev_requirements = cfg.get("dev_requirements", "").split()
ray_requirements = cfg.get("ray_requirements", "").split()  # `pip install -e ".[ray]"`: the Ray engine (#15)

setuptools.setup(
    name=cfg["repo"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    url=cfg["git_url"],
    packages=setuptools.find_packages(include=["stealth_eval", "stealth_eval.*"]),
    include_package_data=True,
    package_data={"stealth_eval": ["resources/*.json", "resources/*.md"]},   # the RAID attacks' word tables
    python_requires=">=" + cfg["min_python"],
    install_requires=requirements,
    extras_require={"dev": dev_requirements, "ray": ray_requirements},
    entry_points={
        "console_scripts": cfg.get("console_scripts", "").split(),
        "nbdev": [f"{cfg['lib_path']}={cfg['lib_path']}._modidx:d"],
    },
    zip_safe=False,
)
